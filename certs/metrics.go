package certs

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/internal/promreg"
)

// maxExpiryNames bounds the per-name expiry series to the soonest-expiring
// certificates: those are the ones an operator must act on, and the bound
// keeps a large fleet's document from exploding the series count.
const maxExpiryNames = 100

type metrics struct {
	issuances  *prometheus.CounterVec
	refusals   *prometheus.CounterVec
	inFlight   prometheus.Gauge
	handshakes *prometheus.CounterVec
	// failedValidations counts the authorizations the CA set invalid for
	// this edge's orders.
	failedValidations prometheus.Counter
	// validationReadErrors counts issuances admitted on this edge's own
	// failed validations, the storage's count being unreadable.
	validationReadErrors prometheus.Counter
}

// newMetrics builds the package's collectors and registers them on reg;
// with a nil reg they still count, unobserved.
func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	mt := &metrics{
		issuances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_tls_issuances_total",
			Help: "Certificate issuances finished, by result (obtained, failed) and kind (new, renewal).",
		}, []string{"result", "kind"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_tls_on_demand_refusals_total",
			Help: "Certificate decisions refused, by reason (not_named, wildcard, backoff, validations: an issuance could take the name to the CA's limit of failed validations an hour).",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_tls_issuances_in_flight",
			Help: "Certificate issuances in progress.",
		}),
		failedValidations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_tls_failed_validations_total",
			Help: "Authorizations the ACME CA set invalid (failed validations) for this edge's orders; Let's Encrypt refuses a name for an hour after 5 within an hour.",
		}),
		validationReadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_tls_failed_validations_read_errors_total",
			Help: "Issuance checks that could not read the fleet's failed validations from the certificate storage and counted this edge's own only.",
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_tls_handshake_certificates_total",
			Help: "Certificate look-ups during TLS handshakes, by result (ok, no_certificate, challenge).",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "no_certificate", "challenge"} {
		mt.handshakes.WithLabelValues(r)
	}
	for _, r := range []string{"not_named", "wildcard", "backoff", "validations"} {
		mt.refusals.WithLabelValues(r)
	}
	if reg == nil {
		return mt, nil
	}
	backedOff := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "scafo_edge_tls_backoff_names",
		Help: "Names held back after a failed issuance.",
	}, func() float64 { return float64(m.backoff.count()) })
	cs := []prometheus.Collector{mt.issuances, mt.refusals, mt.inFlight, mt.handshakes, backedOff, &expiryCollector{m: m}}
	if m.mode == ModeACME {
		// Only an ACME CA validates; the internal CA's edge exports none.
		cs = append(cs, mt.failedValidations, mt.validationReadErrors)
	}
	if err := promreg.Register(reg, cs...); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			return nil, fmt.Errorf("register tls metrics: %w (one Manager per registry)", err)
		}
		return nil, fmt.Errorf("register tls metrics: %w", err)
	}
	return mt, nil
}

var (
	expiryDesc = prometheus.NewDesc("scafo_edge_tls_certificate_expiry_seconds",
		"Seconds until a held certificate expires, for the 100 soonest-expiring, by its first name.",
		[]string{"name"}, nil)
	heldDesc = prometheus.NewDesc("scafo_edge_tls_certificates",
		"Certificates held in memory.", nil, nil)
	failedHourDesc = prometheus.NewDesc("scafo_edge_tls_failed_validations_last_hour",
		"Failed validations in the last hour per name, every edge's as recorded in the certificate storage, for the 100 names with most; issuance stops before 5, Let's Encrypt's limit.",
		[]string{"name"}, nil)
)

// expiryCollector reports expiry at scrape time from certmagic's cache.
type expiryCollector struct{ m *Manager }

func (c *expiryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- expiryDesc
	ch <- heldDesc
	ch <- failedHourDesc
}

func (c *expiryCollector) Collect(ch chan<- prometheus.Metric) {
	for i, vc := range c.m.FailedValidations() {
		if i == maxExpiryNames {
			break
		}
		ch <- prometheus.MustNewConstMetric(failedHourDesc, prometheus.GaugeValue, float64(vc.Failed), vc.Name)
	}
	certs := c.m.Certificates()
	ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(len(certs)))
	seen := map[string]bool{}
	for _, ci := range certs {
		if len(seen) == maxExpiryNames {
			break
		}
		// Two certificates for one name (a renewal not yet evicted): the
		// first, soonest to expire, is reported.
		if seen[ci.Names[0]] {
			continue
		}
		seen[ci.Names[0]] = true
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, time.Until(ci.NotAfter).Seconds(), ci.Names[0])
	}
}
