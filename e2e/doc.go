// Package e2e holds the end-to-end tests: they build the scafo-edge binary
// once (with the race detector, in TestMain) and drive it as an operator
// would, with real node fakes, upstreams, clients, Pebble for ACME, and the
// image's own build flags for the packaging checks. Unit tests live beside
// the code they test; these need the whole process.
package e2e
