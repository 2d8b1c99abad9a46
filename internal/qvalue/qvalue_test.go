package qvalue

import "testing"

func TestFromParams(t *testing.T) {
	for _, tc := range []struct {
		params string
		want   int
	}{
		{"", 1000},
		{"q=0", 0},
		{"q=0.5", 500},
		{" Q = 0.25 ", 250},
		{"level=1; q=0.125", 125},
		{"q=1", 1000},
		{"q=1.000", 1000},
		{"q=1.001", 0},
		{"q=0.1234", 0},
		{"q=high", 0},
		{"q=2", 0},
		{"q=-0", 0},
		{"q=.5", 0},
		{"level=1", 1000},
	} {
		if got := FromParams(tc.params); got != tc.want {
			t.Errorf("FromParams(%q) = %d, want %d", tc.params, got, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "1", "0.5", "1.000", "0.999", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if q := Parse(s); q < 0 || q > 1000 {
			t.Fatalf("Parse(%q) = %d, outside 0..1000", s, q)
		}
	})
}
