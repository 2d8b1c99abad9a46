//go:build race

package admission

// raceEnabled: the tests run under the race detector, whose bookkeeping
// allocates.
const raceEnabled = true
