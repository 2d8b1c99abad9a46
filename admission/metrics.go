package admission

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/scafo/scafo-edge/internal/promreg"
)

// Reasons of scafo_edge_shed_total beyond the request refusals'
// (Refusal.String); docs/monitoring.md says what each means.
const (
	shedIdle           = "idle_closed"
	shedSlow           = "slow_headers"
	shedHeld           = "held_past_share"
	refusedClientConns = "client_conns"
	refusedClientSlow  = "client_slow_headers"
	refusedAdminConns  = "admin_conns"
)

// ShedReasons lists every reason of scafo_edge_shed_total.
var ShedReasons = []string{shedIdle, shedSlow, shedHeld, refusedClientConns, refusedClientSlow, refusedAdminConns, RefusedMemory.String(), RefusedBudget.String(), RefusedClientRequests.String(),
	RefusedClientRate.String(), RefusedAppQueueFull.String(), RefusedAppQueueTimeout.String()}

type metrics struct {
	shed                          *prometheus.CounterVec
	acceptPauses, paced, episodes prometheus.Counter
	pressure                      prometheus.Gauge
	appInFlight, appQueued        *prometheus.GaugeVec
	logMu                         sync.Mutex
	logs                          map[string]*rate.Sometimes // a refusal's line, once a minute
}

func newMetrics(reg prometheus.Registerer, c *Controller) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	perApp := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"application"})
	}
	m := &metrics{
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_shed_total",
			Help: "Connections and requests the edge shed or refused to stay within its budget and fair shares, by reason.",
		}, []string{"reason"}),
		acceptPauses: counter("scafo_edge_accept_pauses_total", "Times the edge stopped accepting connections because its connection budget was spent (new ones waited in the kernel's backlog)."),
		paced:        counter("scafo_edge_paced_heads_total", "First request heads of plain HTTP connections that, while the box was contended, kept trickling (bytes came four times) and had waited a second: each is looked at on the edge's schedule from then on, a second after and then twice as far each turn, up to 4 to 6 s, until the contention is over."),
		episodes:     counter("scafo_edge_pressure_episodes_total", "Episodes of overload started."),
		pressure: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_pressure",
			Help: "1 during an episode of overload (connections or memory past their high-water marks), else 0.",
		}),
		appInFlight: perApp("scafo_edge_app_in_flight", "Requests in flight to an application's upstreams, WebSockets and streams included."),
		appQueued:   perApp("scafo_edge_app_queued", "Requests waiting for their application's share to free a slot."),
		logs:        map[string]*rate.Sometimes{},
	}
	for _, r := range ShedReasons {
		m.shed.WithLabelValues(r)
	}
	gauge := func(name, help string, labels prometheus.Labels, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	connsHelp := "Connections held now that count against the budget, by kind (client: accepted over TCP; http3: QUIC, which take what TCP leaves; upstream: dialed)."
	err := promreg.Register(reg, m.shed, m.acceptPauses, m.paced, m.pressure, m.episodes, m.appInFlight, m.appQueued,
		gauge("scafo_edge_conns", connsHelp, prometheus.Labels{"kind": "client"}, func() float64 { return float64(c.clientConns.Load()) }),
		gauge("scafo_edge_conns", connsHelp, prometheus.Labels{"kind": "upstream"}, func() float64 { return float64(c.upstreamConns.Load()) }),
		gauge("scafo_edge_conns", connsHelp, prometheus.Labels{"kind": "http3"}, func() float64 { return float64(c.quicConns.Load()) }),
		gauge("scafo_edge_conns_limit", "The connection budget: client and upstream connections the edge holds at most (--max-conns).", nil,
			func() float64 { return float64(c.limits.MaxConns) }),
		gauge("scafo_edge_idle_conns", "Client connections idle now, the first to be closed under pressure.", nil,
			func() float64 { return float64(c.conns.idleLen()) }),
		gauge("scafo_edge_memory_limit_bytes", "The memory limit the edge keeps under, by where it came from (flag, GOMEMLIMIT, cgroup v1, cgroup v2, share of MemTotal); 0 from none: none known.",
			prometheus.Labels{"from": cmp.Or(c.limits.MemoryFrom, "none")}, func() float64 { return float64(c.limits.MemoryLimit) }),
		gauge("scafo_edge_waiting_heads", "Connections of the plain HTTP listener whose first request head has not ended, awaited outside the HTTP server (no goroutine of their own) until it does, their client goes, or the header timeout.", nil,
			func() float64 { return float64(c.waitingHeads()) }),
		gauge("scafo_edge_client_addresses", "Client addresses the edge keeps counts for now.", nil,
			func() float64 { return float64(c.clients.len()) }),
	)
	if err != nil {
		return nil, fmt.Errorf("register admission metrics: %w", err)
	}
	return m, nil
}

// refusal counts a connection or request refused for reason, and logs the
// kind once a minute. No address is logged: a flood would choose what the
// log says.
func (c *Controller) refusal(reason string) {
	c.m.shed.WithLabelValues(reason).Inc()
	c.m.logMu.Lock()
	s := c.m.logs[reason]
	if s == nil {
		s = &rate.Sometimes{First: 1, Interval: time.Minute}
		c.m.logs[reason] = s
	}
	c.m.logMu.Unlock()
	s.Do(func() { c.log.Warn().Str("reason", reason).Msg(refusalMessages[reason]) })
}

var refusalMessages = map[string]string{
	refusedClientConns:              "refusing new connections from a client address that holds its share of connections (each held a second, then closed); more are counted in scafo_edge_shed_total, logged again in a minute",
	refusedClientSlow:               "at the connection budget, refusing new connections from a client address whose connections are mostly slow first requests (each held a second, then closed); more are counted in scafo_edge_shed_total, logged again in a minute",
	refusedAdminConns:               "refusing new connections to the admin listener past a share of its own small pool of connections (per address; for all the addresses not allowed /metrics; in all), which keeps it from spending the descriptors reserved for the edge's own work (each held a second, then closed); more are counted in scafo_edge_shed_total, logged again in a minute",
	RefusedMemory.String():          "refusing new requests (503) while memory is past its high-water mark",
	RefusedBudget.String():          "the connection budget and its overdraft are spent: refusing new requests (503), and not dialling upstreams for admitted ones (502); more are counted, logged again in a minute",
	RefusedClientRequests.String():  "refusing requests (429) from a client address that has its share in flight; more are counted, logged again in a minute",
	RefusedClientRate.String():      "refusing requests (429) from a client address past its request rate; more are counted, logged again in a minute",
	RefusedAppQueueFull.String():    "an application holds its share of requests in flight and its queue is full: refusing its new requests (503)",
	RefusedAppQueueTimeout.String(): "an application held its share of requests in flight for a whole queue timeout: refusing its waiting requests (503)",
}
