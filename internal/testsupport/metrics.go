package testsupport

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Labels selects one series of a metric family; a label it does not name
// may have any value.
type Labels map[string]string

// MetricValue returns the value of the series of the named metric that has
// the given labels, from a registry, and whether such a series exists. A
// counter, gauge or untyped series gives its value; a histogram or summary
// gives its sample count.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string, labels Labels) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return seriesValue(mf, labels)
		}
	}
	return 0, false
}

// ScrapeValue is MetricValue for a /metrics response in the Prometheus text
// format, parsed by Prometheus's own parser.
func ScrapeValue(t testing.TB, text, name string, labels Labels) (float64, bool) {
	t.Helper()
	mfs, err := ParseScrape(text)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	return seriesValue(mf, labels)
}

// ParseScrape parses a /metrics response in the Prometheus text format.
func ParseScrape(text string) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("text format: %w", err)
	}
	return mfs, nil
}

func seriesValue(mf *dto.MetricFamily, labels Labels) (float64, bool) {
	for _, m := range mf.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Summary != nil:
			return float64(m.Summary.GetSampleCount()), true
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, want Labels) bool {
	matched := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			matched++
		}
	}
	return matched == len(want)
}
