package admission

import "time"

// Status is the controller's state, for the status page.
type Status struct {
	Pressure          bool      `json:"pressure"`
	PressureReason    string    `json:"pressure_reason,omitempty"`
	PressureSince     time.Time `json:"pressure_since,omitzero"`
	AcceptPaused      bool      `json:"accept_paused"`
	SharesBind        bool      `json:"shares_bind"` // client addresses are held to their shares of connections now
	MemoryHigh        bool      `json:"memory_high"`
	ClientConns       int64     `json:"client_conns"`
	HTTP3Conns        int64     `json:"http3_conns"`
	UpstreamConns     int64     `json:"upstream_conns"`
	IdleConns         int       `json:"idle_conns"`
	MaxConns          int       `json:"max_conns"`
	ConnsPerClient    int       `json:"conns_per_client"`
	RequestsPerClient int       `json:"requests_per_client"`
	AppShare          float64   `json:"app_share"`
	ClientRate        float64   `json:"client_rate,omitempty"`
	MemoryLimit       int64     `json:"memory_limit_bytes,omitempty"`
	MemoryFrom        string    `json:"memory_limit_from,omitempty"` // Limits.MemoryFrom
	MemoryFile        string    `json:"memory_limit_file,omitempty"` // Limits.MemoryFile
	Clients           int       `json:"client_addresses"`
	Apps              []AppLoad `json:"applications"`
	// The admin listener's connections, held apart from the budget
	// (AdminListener): now, at most, and per peer allowed /metrics.
	AdminConns          int64 `json:"admin_conns"`
	MaxAdminConns       int   `json:"max_admin_conns"`
	AdminConnsPerClient int   `json:"admin_conns_per_client"`
}

// AppLoad is one application's requests in flight to its upstreams,
// waiting for a slot, and its share now.
type AppLoad struct {
	Application string `json:"application"`
	InFlight    int    `json:"in_flight"`
	Queued      int    `json:"queued"`
	Limit       int    `json:"limit"`
}

// Snapshot returns the controller's state now.
func (c *Controller) Snapshot() Status {
	if c == nil {
		return Status{}
	}
	c.episodeMu.Lock()
	ep := c.episode
	c.episodeMu.Unlock()
	return Status{
		Pressure: ep.active, PressureReason: ep.reason, PressureSince: ep.started,
		AcceptPaused: c.paused.Load(), SharesBind: c.contended.Load(), MemoryHigh: c.memHigh.Load(),
		ClientConns: c.clientConns.Load(), HTTP3Conns: c.quicConns.Load(), UpstreamConns: c.upstreamConns.Load(), IdleConns: c.conns.idleLen(),
		MaxConns: c.limits.MaxConns, ConnsPerClient: c.limits.ConnsPerClient, RequestsPerClient: c.limits.RequestsPerClient,
		AppShare: c.limits.AppShare, ClientRate: c.limits.ClientRate, MemoryLimit: c.limits.MemoryLimit,
		MemoryFrom: c.limits.MemoryFrom, MemoryFile: c.limits.MemoryFile,
		Clients: c.clients.len(), Apps: c.apps.loads(),
		AdminConns: c.admin.all.Load(), MaxAdminConns: c.limits.AdminConns, AdminConnsPerClient: int(c.admin.perClient),
	}
}
