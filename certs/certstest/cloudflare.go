package certstest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// TXTSink receives the TXT records the fake Cloudflare API is asked to
// create and delete; *Pebble is one, so Pebble's validator sees them.
type TXTSink interface {
	SetTXT(name, value string) error
	ClearTXT(name string) error
}

// FakeCloudflare is a small fake of the Cloudflare v4 API: zone look-up by
// name, zone list, and DNS record create, list and delete, which is what
// github.com/libdns/cloudflare calls. TXT records go to a TXTSink.
type FakeCloudflare struct {
	// Client sends every request, whatever its host, to the fake; hand it
	// to cloudflare.Provider.HTTPClient.
	Client *http.Client

	token string
	sink  TXTSink

	mu      sync.Mutex
	zones   map[string]string // id -> name
	records map[string]cfRecord
	nextID  int
	created int
}

type cfRecord struct {
	ID       string `json:"id"`
	ZoneID   string `json:"zone_id"`
	ZoneName string `json:"zone_name"`
	Type     string `json:"type"`
	Name     string `json:"name"`
	Content  string `json:"content"`
	TTL      int    `json:"ttl"`
}

// NewFakeCloudflare serves the fake on loopback until t ends. Requests must
// carry "Authorization: Bearer <token>".
func NewFakeCloudflare(t testing.TB, token string, zones []string, sink TXTSink) *FakeCloudflare {
	t.Helper()
	f := &FakeCloudflare{token: token, sink: sink, zones: map[string]string{}, records: map[string]cfRecord{}}
	for i, z := range zones {
		f.zones[fmt.Sprintf("zone%d", i+1)] = strings.TrimSuffix(z, ".")
	}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	target, _ := url.Parse(srv.URL)
	f.Client = &http.Client{Transport: redirectTransport{target: target, next: srv.Client().Transport}}
	return f
}

// RecordsCreated returns how many records the fake has been asked to create.
func (f *FakeCloudflare) RecordsCreated() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.created
}

// redirectTransport sends every request to the fake server, keeping the path.
type redirectTransport struct {
	target *url.URL
	next   http.RoundTripper
}

func (rt redirectTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = rt.target.Scheme, rt.target.Host, rt.target.Host
	return rt.next.RoundTrip(r)
}

type cfEnvelope struct {
	Success bool             `json:"success"`
	Errors  []map[string]any `json:"errors"`
	Result  any              `json:"result,omitempty"`
}

func (f *FakeCloudflare) reply(w http.ResponseWriter, status int, result any, errMsg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	env := cfEnvelope{Success: errMsg == "", Errors: []map[string]any{}, Result: result}
	if errMsg != "" {
		env.Errors = append(env.Errors, map[string]any{"code": 1000, "message": errMsg})
	}
	json.NewEncoder(w).Encode(env)
}

func (f *FakeCloudflare) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		f.reply(w, http.StatusForbidden, nil, "Invalid API token")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/client/v4")
	parts := strings.Split(strings.Trim(path, "/"), "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case len(parts) == 1 && parts[0] == "zones" && r.Method == http.MethodGet:
		want := strings.TrimSuffix(r.URL.Query().Get("name"), ".")
		out := []map[string]any{}
		for id, name := range f.zones {
			if want == "" || want == name {
				out = append(out, map[string]any{"id": id, "name": name, "status": "active"})
			}
		}
		f.reply(w, http.StatusOK, out, "")
	case len(parts) == 3 && parts[0] == "zones" && parts[2] == "dns_records":
		zoneName, ok := f.zones[parts[1]]
		if !ok {
			f.reply(w, http.StatusNotFound, nil, "zone not found")
			return
		}
		if r.Method == http.MethodPost {
			f.create(w, r, parts[1], zoneName)
			return
		}
		if r.Method == http.MethodGet {
			q := r.URL.Query()
			out := []cfRecord{}
			for _, rec := range f.records {
				if rec.ZoneID != parts[1] || (q.Get("type") != "" && rec.Type != q.Get("type")) ||
					(q.Get("name") != "" && rec.Name != strings.TrimSuffix(q.Get("name"), ".")) ||
					(q.Get("content.contains") != "" && !strings.Contains(rec.Content, q.Get("content.contains"))) {
					continue
				}
				out = append(out, rec)
			}
			f.reply(w, http.StatusOK, out, "")
			return
		}
		f.reply(w, http.StatusMethodNotAllowed, nil, "method not allowed")
	case len(parts) == 4 && parts[0] == "zones" && parts[2] == "dns_records" && r.Method == http.MethodDelete:
		rec, ok := f.records[parts[3]]
		if !ok || rec.ZoneID != parts[1] {
			f.reply(w, http.StatusNotFound, nil, "record not found")
			return
		}
		delete(f.records, rec.ID)
		if rec.Type == "TXT" && f.sink != nil {
			// The sink clears a name whole; keep values another challenge
			// for the same name (a wildcard and its base) still needs.
			others := false
			for _, o := range f.records {
				others = others || (o.Type == "TXT" && o.Name == rec.Name)
			}
			if !others {
				if err := f.sink.ClearTXT(rec.Name); err != nil {
					f.reply(w, http.StatusBadGateway, nil, err.Error())
					return
				}
			}
		}
		f.reply(w, http.StatusOK, map[string]string{"id": rec.ID}, "")
	default:
		f.reply(w, http.StatusNotFound, nil, "no route "+r.Method+" "+r.URL.Path)
	}
}

func (f *FakeCloudflare) create(w http.ResponseWriter, r *http.Request, zoneID, zoneName string) {
	var in cfRecord
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		f.reply(w, http.StatusBadRequest, nil, "bad json: "+err.Error())
		return
	}
	name := strings.TrimSuffix(in.Name, ".")
	switch {
	case name == "@" || name == "":
		name = zoneName
	case name != zoneName && !strings.HasSuffix(name, "."+zoneName):
		name += "." + zoneName
	}
	f.nextID++
	f.created++
	rec := cfRecord{ID: fmt.Sprintf("rec%d", f.nextID), ZoneID: zoneID, ZoneName: zoneName, Type: in.Type, Name: name, Content: in.Content, TTL: in.TTL}
	if rec.Type == "TXT" && f.sink != nil {
		if err := f.sink.SetTXT(name, strings.Trim(in.Content, `"`)); err != nil {
			f.reply(w, http.StatusBadGateway, nil, err.Error())
			return
		}
	}
	f.records[rec.ID] = rec
	f.reply(w, http.StatusOK, rec, "")
}
