package certs

import (
	"context"
	"crypto/sha1"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mholt/acmez/v3/acme"
)

// fakeZone is the one zone a fake DNS API holds, example.com, as TXT
// records with the name relative to it, the text unquoted, and the TTL.
type fakeZone struct {
	t      *testing.T
	mu     sync.Mutex
	nextID int
	recs   map[int]fakeTXT
}

type fakeTXT struct {
	Name, Text string
	TTL        int
}

const fakeZoneName = "example.com"

func newFakeZone(t *testing.T) *fakeZone {
	return &fakeZone{t: t, nextID: 100, recs: map[int]fakeTXT{}}
}

func (z *fakeZone) add(name, text string, ttl int) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.nextID++
	z.recs[z.nextID] = fakeTXT{Name: name, Text: text, TTL: ttl}
	return z.nextID
}

func (z *fakeZone) get(id int) (fakeTXT, bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	r, ok := z.recs[id]
	return r, ok
}

func (z *fakeZone) remove(id int) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	_, ok := z.recs[id]
	delete(z.recs, id)
	return ok
}

// ids lists the records at name (all for ""), oldest first.
func (z *fakeZone) ids(name string) []int {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []int
	for id, r := range z.recs {
		if name == "" || r.Name == name {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// set makes the records at name exactly texts, each with ttl.
func (z *fakeZone) set(name string, texts []string, ttl int) {
	for _, id := range z.ids(name) {
		z.remove(id)
	}
	for _, text := range texts {
		z.add(name, text, ttl)
	}
}

func (z *fakeZone) texts(name string) ([]string, int) {
	var texts []string
	ttl := 0
	for _, id := range z.ids(name) {
		r, _ := z.get(id)
		texts = append(texts, r.Text)
		ttl = r.TTL
	}
	return texts, ttl
}

func (z *fakeZone) snapshot() []fakeTXT {
	var out []fakeTXT
	for _, id := range z.ids("") {
		r, _ := z.get(id)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b fakeTXT) int { return strings.Compare(a.Name+" "+a.Text, b.Name+" "+b.Text) })
	return out
}

// fail answers a request the fake does not expect, failing the test.
func (z *fakeZone) fail(w http.ResponseWriter, r *http.Request, why string) {
	z.t.Errorf("fake API: %s %s: %s", r.Method, r.URL, why)
	http.Error(w, why, http.StatusBadRequest)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func decodeJSON(r *http.Request, v any) error {
	return json.NewDecoder(r.Body).Decode(v)
}

func quoted(s string) bool { return len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' }

// hetznerAPI is the Hetzner Cloud API's zone RRset actions.
func hetznerAPI(z *fakeZone) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/zones/{zone}/rrsets/{name}/{type}/actions/{op}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hz-token" {
			writeJSON(w, 401, map[string]any{"error": map[string]string{"code": "unauthorized", "message": "unable to authenticate"}})
			return
		}
		if r.PathValue("zone") != fakeZoneName {
			writeJSON(w, 404, map[string]any{"error": map[string]string{"code": "not_found", "message": "zone not found"}})
			return
		}
		if r.PathValue("type") != "TXT" {
			z.fail(w, r, "not TXT")
			return
		}
		var body struct {
			Records []struct {
				Value string `json:"value"`
			} `json:"records"`
			TTL *int `json:"ttl"`
		}
		if err := decodeJSON(r, &body); err != nil {
			z.fail(w, r, err.Error())
			return
		}
		name := r.PathValue("name")
		for _, rec := range body.Records {
			if !quoted(rec.Value) {
				writeJSON(w, 422, map[string]any{"error": map[string]string{"code": "invalid_input", "message": "TXT value must be quoted"}})
				return
			}
			switch r.PathValue("op") {
			case "add_records":
				ttl := 3600
				if body.TTL != nil {
					ttl = *body.TTL
				}
				z.add(name, unquoteTXT(rec.Value), ttl)
			case "remove_records":
				for _, id := range z.ids(name) {
					if got, _ := z.get(id); got.Text == unquoteTXT(rec.Value) {
						z.remove(id)
					}
				}
			default:
				z.fail(w, r, "unknown action")
				return
			}
		}
		now := time.Now().UTC()
		writeJSON(w, 201, map[string]any{"action": map[string]any{
			"id": 1, "command": r.PathValue("op"), "status": "success", "progress": 100,
			"started": now, "finished": now, "error": nil, "resources": []any{},
		}})
	})
	return mux
}

// desecAPI is deSEC's RRset API.
func desecAPI(z *fakeZone) http.Handler {
	mux := http.NewServeMux()
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Token ds-token" {
			writeJSON(w, 401, map[string]string{"detail": "Invalid token."})
			return false
		}
		if r.PathValue("domain") != fakeZoneName {
			writeJSON(w, 404, map[string]string{"detail": "Not found."})
			return false
		}
		return true
	}
	type rrset struct {
		Subname string   `json:"subname"`
		Type    string   `json:"type"`
		Records []string `json:"records"`
		TTL     int      `json:"ttl"`
	}
	mux.HandleFunc("GET /api/v1/domains/{domain}/rrsets/{subname}/{type}", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		texts, ttl := z.texts(r.PathValue("subname"))
		if len(texts) == 0 || r.PathValue("type") != "TXT" {
			writeJSON(w, 404, map[string]string{"detail": "Not found."})
			return
		}
		set := rrset{Subname: r.PathValue("subname"), Type: "TXT", TTL: ttl}
		for _, t := range texts {
			set.Records = append(set.Records, strconv.Quote(t))
		}
		writeJSON(w, 200, set)
	})
	mux.HandleFunc("PUT /api/v1/domains/{domain}/rrsets/", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		var sets []rrset
		if err := decodeJSON(r, &sets); err != nil {
			z.fail(w, r, err.Error())
			return
		}
		for _, s := range sets {
			if s.Type != "TXT" || (len(s.Records) > 0 && s.TTL < 3600) {
				writeJSON(w, 400, map[string]string{"detail": "bad rrset"})
				return
			}
			var texts []string
			for _, v := range s.Records {
				if !quoted(v) {
					writeJSON(w, 400, map[string]string{"detail": "TXT records must be quoted"})
					return
				}
				texts = append(texts, unquoteTXT(v))
			}
			z.set(s.Subname, texts, s.TTL)
		}
		writeJSON(w, 200, sets)
	})
	return mux
}

// porkbunAPI is Porkbun's JSON API v3 (create, retrieve by name and type,
// delete by ID; not deleteByNameType, which the edge must not use).
func porkbunAPI(z *fakeZone) http.Handler {
	mux := http.NewServeMux()
	type req struct {
		APIKey, SecretAPIKey string
		Name, Type, Content  string
		TTL                  string
	}
	read := func(w http.ResponseWriter, r *http.Request) (req, bool) {
		var body struct {
			APIKey       string `json:"apikey"`
			SecretAPIKey string `json:"secretapikey"`
			Name         string `json:"name"`
			Type         string `json:"type"`
			Content      string `json:"content"`
			TTL          string `json:"ttl"`
		}
		if err := decodeJSON(r, &body); err != nil {
			z.fail(w, r, err.Error())
			return req{}, false
		}
		if body.APIKey != "pk1_key" || body.SecretAPIKey != "sk1_secret" {
			writeJSON(w, 403, map[string]string{"status": "ERROR", "message": "Invalid API key."})
			return req{}, false
		}
		if r.PathValue("domain") != fakeZoneName {
			writeJSON(w, 400, map[string]string{"status": "ERROR", "message": "Invalid domain."})
			return req{}, false
		}
		return req{body.APIKey, body.SecretAPIKey, body.Name, body.Type, body.Content, body.TTL}, true
	}
	mux.HandleFunc("POST /api/json/v3/dns/create/{domain}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := read(w, r)
		if !ok {
			return
		}
		ttl, err := strconv.Atoi(b.TTL)
		if err != nil || ttl < 600 || b.Type != "TXT" {
			writeJSON(w, 400, map[string]string{"status": "ERROR", "message": "bad record"})
			return
		}
		id := z.add(b.Name, b.Content, ttl)
		writeJSON(w, 200, map[string]any{"status": "SUCCESS", "id": id})
	})
	mux.HandleFunc("POST /api/json/v3/dns/retrieveByNameType/{domain}/{type}/{sub}", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := read(w, r); !ok {
			return
		}
		recs := []map[string]string{}
		for _, id := range z.ids(r.PathValue("sub")) {
			rec, _ := z.get(id)
			recs = append(recs, map[string]string{"id": strconv.Itoa(id), "name": rec.Name + "." + fakeZoneName, "type": "TXT", "content": rec.Text, "ttl": strconv.Itoa(rec.TTL)})
		}
		writeJSON(w, 200, map[string]any{"status": "SUCCESS", "records": recs})
	})
	mux.HandleFunc("POST /api/json/v3/dns/delete/{domain}/{id}", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := read(w, r); !ok {
			return
		}
		id, _ := strconv.Atoi(r.PathValue("id"))
		if !z.remove(id) {
			writeJSON(w, 400, map[string]string{"status": "ERROR", "message": "Invalid record id."})
			return
		}
		writeJSON(w, 200, map[string]string{"status": "SUCCESS"})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { z.fail(w, r, "not a call the edge should make") })
	return mux
}

// gandiAPI is Gandi's LiveDNS API (v5).
func gandiAPI(z *fakeZone) http.Handler {
	mux := http.NewServeMux()
	notFound := func(w http.ResponseWriter) {
		writeJSON(w, 404, map[string]any{"code": 404, "message": "Not Found", "object": "HTTPNotFound", "cause": "Not Found"})
	}
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer gd-token" {
			writeJSON(w, 401, map[string]any{"code": 401, "message": "Unauthorized", "object": "HTTPUnauthorized", "cause": "Unauthorized"})
			return false
		}
		if r.PathValue("fqdn") != fakeZoneName {
			notFound(w)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /v5/livedns/domains/{fqdn}/records", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		byName := map[string][]string{}
		ttls := map[string]int{}
		for _, id := range z.ids("") {
			rec, _ := z.get(id)
			byName[rec.Name] = append(byName[rec.Name], strconv.Quote(rec.Text))
			ttls[rec.Name] = rec.TTL
		}
		sets := []map[string]any{}
		for name, values := range byName {
			sets = append(sets, map[string]any{"rrset_name": name, "rrset_type": "TXT", "rrset_ttl": ttls[name], "rrset_values": values})
		}
		writeJSON(w, 200, sets)
	})
	mux.HandleFunc("GET /v5/livedns/domains/{fqdn}", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		writeJSON(w, 200, map[string]any{"fqdn": fakeZoneName, "domain_href": "https://api.gandi.net/v5/livedns/domains/" + fakeZoneName,
			"domain_records_href": "https://api.gandi.net/v5/livedns/domains/" + fakeZoneName + "/records"})
	})
	type rrset struct {
		Name   string   `json:"rrset_name"`
		Type   string   `json:"rrset_type"`
		TTL    int      `json:"rrset_ttl"`
		Values []string `json:"rrset_values"`
	}
	mux.HandleFunc("/v5/livedns/domains/{fqdn}/records/{name}/{type}", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		name := r.PathValue("name")
		if r.PathValue("type") != "TXT" {
			z.fail(w, r, "not TXT")
			return
		}
		switch r.Method {
		case http.MethodGet:
			texts, ttl := z.texts(name)
			if len(texts) == 0 {
				notFound(w)
				return
			}
			set := rrset{Name: name, Type: "TXT", TTL: ttl}
			for _, t := range texts {
				set.Values = append(set.Values, strconv.Quote(t)) // LiveDNS hands TXT values back quoted
			}
			writeJSON(w, 200, set)
		case http.MethodPut:
			var set rrset
			if err := decodeJSON(r, &set); err != nil {
				z.fail(w, r, err.Error())
				return
			}
			if set.TTL < 300 {
				writeJSON(w, 400, map[string]any{"code": 400, "message": "rrset_ttl must be at least 300", "object": "HTTPBadRequest", "cause": "Bad Request"})
				return
			}
			var texts []string
			for _, v := range set.Values {
				texts = append(texts, unquoteTXT(v))
			}
			z.set(name, texts, set.TTL)
			writeJSON(w, 201, map[string]string{"message": "DNS Record Created"})
		case http.MethodDelete:
			z.set(name, nil, 0)
			w.WriteHeader(204)
		default:
			z.fail(w, r, "method")
		}
	})
	return mux
}

// doAPI is DigitalOcean's domain records API (v2).
func doAPI(z *fakeZone) http.Handler {
	mux := http.NewServeMux()
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer do-token" {
			writeJSON(w, 401, map[string]string{"id": "Unauthorized", "message": "Unable to authenticate you"})
			return false
		}
		if r.PathValue("zone") != fakeZoneName {
			writeJSON(w, 404, map[string]string{"id": "not_found", "message": "The resource you were accessing could not be found."})
			return false
		}
		return true
	}
	record := func(id int, rec fakeTXT) map[string]any {
		return map[string]any{"id": id, "type": "TXT", "name": rec.Name, "data": rec.Text, "ttl": rec.TTL}
	}
	mux.HandleFunc("POST /v2/domains/{zone}/records", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		var body struct {
			Type, Name, Data string
			TTL              int
		}
		if err := decodeJSON(r, &body); err != nil {
			z.fail(w, r, err.Error())
			return
		}
		if body.Type != "TXT" || body.TTL < 30 {
			writeJSON(w, 422, map[string]string{"id": "unprocessable_entity", "message": "bad record"})
			return
		}
		id := z.add(body.Name, body.Data, body.TTL)
		rec, _ := z.get(id)
		writeJSON(w, 201, map[string]any{"domain_record": record(id, rec)})
	})
	mux.HandleFunc("GET /v2/domains/{zone}/records", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		// name filters by the full name, type by the type.
		name, ok := strings.CutSuffix(r.URL.Query().Get("name"), "."+fakeZoneName)
		if !ok || r.URL.Query().Get("type") != "TXT" {
			z.fail(w, r, "listing without type=TXT and a name in the zone")
			return
		}
		recs := []map[string]any{}
		for _, id := range z.ids(name) {
			rec, _ := z.get(id)
			recs = append(recs, record(id, rec))
		}
		writeJSON(w, 200, map[string]any{"domain_records": recs, "links": map[string]any{}, "meta": map[string]int{"total": len(recs)}})
	})
	mux.HandleFunc("DELETE /v2/domains/{zone}/records/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		id, _ := strconv.Atoi(r.PathValue("id"))
		if !z.remove(id) {
			writeJSON(w, 404, map[string]string{"id": "not_found", "message": "The resource you were accessing could not be found."})
			return
		}
		w.WriteHeader(204)
	})
	return mux
}

// ovhAPI is OVH's API (1.0), checking each call's signature as OVH does.
func ovhAPI(z *fakeZone) http.Handler {
	mux := http.NewServeMux()
	signed := func(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
		body, _ := io.ReadAll(r.Body)
		ts := r.Header.Get("X-Ovh-Timestamp")
		u := "http://" + r.Host + r.URL.RequestURI()
		want := fmt.Sprintf("$1$%x", sha1.Sum([]byte(strings.Join([]string{"ovh-secret", "ovh-consumer", r.Method, u, string(body), ts}, "+"))))
		if r.Header.Get("X-Ovh-Application") != "ovh-app" || r.Header.Get("X-Ovh-Consumer") != "ovh-consumer" || r.Header.Get("X-Ovh-Signature") != want {
			writeJSON(w, 403, map[string]string{"message": "Invalid signature"})
			return nil, false
		}
		if r.PathValue("zone") != fakeZoneName {
			writeJSON(w, 404, map[string]string{"message": "This service does not exist"})
			return nil, false
		}
		return body, true
	}
	type record struct {
		ID        int    `json:"id"`
		Zone      string `json:"zone"`
		FieldType string `json:"fieldType"`
		SubDomain string `json:"subDomain"`
		TTL       int    `json:"ttl"`
		Target    string `json:"target"`
	}
	mux.HandleFunc("GET /1.0/auth/time", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, time.Now().Unix())
	})
	mux.HandleFunc("POST /1.0/domain/zone/{zone}/record", func(w http.ResponseWriter, r *http.Request) {
		body, ok := signed(w, r)
		if !ok {
			return
		}
		var rec record
		if err := json.Unmarshal(body, &rec); err != nil || rec.FieldType != "TXT" || rec.TTL < 60 {
			writeJSON(w, 400, map[string]string{"message": "Invalid record"})
			return
		}
		rec.ID = z.add(rec.SubDomain, unquoteTXT(rec.Target), rec.TTL)
		rec.Zone = fakeZoneName
		writeJSON(w, 200, rec)
	})
	mux.HandleFunc("GET /1.0/domain/zone/{zone}/record", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := signed(w, r); !ok {
			return
		}
		if r.URL.Query().Get("fieldType") != "TXT" {
			z.fail(w, r, "listing without fieldType=TXT")
			return
		}
		ids := z.ids(r.URL.Query().Get("subDomain"))
		if ids == nil {
			ids = []int{}
		}
		writeJSON(w, 200, ids)
	})
	mux.HandleFunc("/1.0/domain/zone/{zone}/record/{id}", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := signed(w, r); !ok {
			return
		}
		id, _ := strconv.Atoi(r.PathValue("id"))
		rec, found := z.get(id)
		if !found {
			writeJSON(w, 404, map[string]string{"message": "This record does not exist"})
			return
		}
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, 200, record{ID: id, Zone: fakeZoneName, FieldType: "TXT", SubDomain: rec.Name, TTL: rec.TTL, Target: strconv.Quote(rec.Text)})
		case http.MethodDelete:
			z.remove(id)
			writeJSON(w, 200, nil)
		default:
			z.fail(w, r, "method")
		}
	})
	mux.HandleFunc("POST /1.0/domain/zone/{zone}/refresh", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := signed(w, r); !ok {
			return
		}
		writeJSON(w, 200, nil)
	})
	return mux
}

// apiHostTransport sends requests for the hosts in to (an API's host →
// a test server's host:port) to that server over plain HTTP, and others
// through base: for packages that call their API's fixed URL through
// http.DefaultTransport.
type apiHostTransport struct {
	to   map[string]string
	base http.RoundTripper
}

func (a *apiHostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	host, ok := a.to[r.URL.Host]
	if !ok {
		return a.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = "http", host, ""
	return a.base.RoundTrip(r)
}

// routeAPIHost sends the requests for host to srv for the rest of the
// test. The tests of this package do not run in parallel, so nothing else
// reads http.DefaultTransport meanwhile.
func routeAPIHost(t *testing.T, host string, srv *httptest.Server) {
	t.Helper()
	base := http.DefaultTransport
	u, _ := url.Parse(srv.URL)
	http.DefaultTransport = &apiHostTransport{to: map[string]string{host: u.Host}, base: base}
	t.Cleanup(func() { http.DefaultTransport = base })
}

// TestDNSProviderLibdnsRequests writes and deletes the challenge records of
// a domain (found two parent zones up, past names the API does not know),
// an apex and its wildcard (two records at one name) through each libdns
// provider, against a fake of its API.
func TestDNSProviderLibdnsRequests(t *testing.T) {
	for _, tc := range []struct {
		provider string
		env      map[string]string
		api      func(*fakeZone) http.Handler
		// host is the API's host, routed to the fake through
		// http.DefaultTransport, or through the client the provider is
		// given after "client:"; "" when env points the provider at it
		// (OVH_ENDPOINT, set to the fake's URL).
		host    string
		wantTTL int
	}{
		{"hetzner", map[string]string{"HETZNER_API_TOKEN": "hz-token"}, hetznerAPI, "api.hetzner.cloud", 60},
		{"desec", map[string]string{"DESEC_TOKEN": "ds-token"}, desecAPI, "desec.io", 3600},
		{"porkbun", map[string]string{"PORKBUN_API_KEY": "pk1_key", "PORKBUN_SECRET_API_KEY": "sk1_secret"}, porkbunAPI, "api.porkbun.com", 600},
		{"gandi", map[string]string{"GANDIV5_PERSONAL_ACCESS_TOKEN": "gd-token"}, gandiAPI, "api.gandi.net", 300},
		// godo is given the client, whose transport routes the host.
		{"digitalocean", map[string]string{"DO_AUTH_TOKEN": "do-token"}, doAPI, "client:api.digitalocean.com", 60},
		{"ovh", map[string]string{"OVH_APPLICATION_KEY": "ovh-app", "OVH_APPLICATION_SECRET": "ovh-secret", "OVH_CONSUMER_KEY": "ovh-consumer"}, ovhAPI, "", 60},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			z := newFakeZone(t)
			srv := httptest.NewServer(tc.api(z))
			t.Cleanup(srv.Close)
			env := map[string]string{}
			for k, v := range tc.env {
				env[k] = v
			}
			var client *http.Client
			if host, ok := strings.CutPrefix(tc.host, "client:"); ok {
				u, _ := url.Parse(srv.URL)
				client = &http.Client{Transport: &apiHostTransport{to: map[string]string{host: u.Host}, base: http.DefaultTransport}}
			} else if tc.host != "" {
				routeAPIHost(t, tc.host, srv)
			} else {
				env["OVH_ENDPOINT"] = srv.URL + "/1.0"
			}
			p, err := newDNSProvider(tc.provider, func(k string) string { return env[k] }, client)
			if err != nil {
				t.Fatal(err)
			}
			s := newDNS01Solver(p, nil, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			chal := func(domain, token string) acme.Challenge {
				return acme.Challenge{Type: acme.ChallengeTypeDNS01, Token: token, KeyAuthorization: token + ".thumb",
					Identifier: acme.Identifier{Type: "dns", Value: domain}}
			}
			// A wildcard's authorization is for the domain itself (RFC
			// 8555 §7.1.3), with a challenge of its own.
			www, apex, wild := chal("www.example.com", "tok-www"), chal("example.com", "tok-apex"), chal("example.com", "tok-wild")
			rec := func(c acme.Challenge, name string) fakeTXT {
				return fakeTXT{Name: name, Text: c.DNS01KeyAuthorization(), TTL: tc.wantTTL}
			}
			want := func(step string, recs ...fakeTXT) {
				t.Helper()
				slices.SortFunc(recs, func(a, b fakeTXT) int { return strings.Compare(a.Name+" "+a.Text, b.Name+" "+b.Text) })
				if got := z.snapshot(); !slices.Equal(got, recs) {
					t.Fatalf("after %s the zone holds\n%+v\nwant\n%+v", step, got, recs)
				}
			}
			for _, c := range []acme.Challenge{www, apex, wild} {
				if err := s.Present(ctx, c); err != nil {
					t.Fatalf("Present(%s): %v", c.Identifier.Value, err)
				}
			}
			want("presenting three challenges", rec(www, "_acme-challenge.www"), rec(apex, "_acme-challenge"), rec(wild, "_acme-challenge"))
			if z := s.zones["_acme-challenge.www.example.com"]; z != fakeZoneName {
				t.Errorf("the record of www.example.com went in zone %q, want %s", z, fakeZoneName)
			}
			if err := s.CleanUp(ctx, apex); err != nil {
				t.Fatalf("CleanUp(example.com): %v", err)
			}
			want("cleaning up the apex's", rec(www, "_acme-challenge.www"), rec(wild, "_acme-challenge"))
			for _, c := range []acme.Challenge{wild, www} {
				if err := s.CleanUp(ctx, c); err != nil {
					t.Fatalf("CleanUp(%s): %v", c.Identifier.Value, err)
				}
			}
			want("cleaning up all")
		})
	}
}

// TestDNSProviderLibdnsVars refuses each libdns provider without each of
// its variables, naming the one missing, and OVH with an endpoint that is
// neither a name nor a URL.
func TestDNSProviderLibdnsVars(t *testing.T) {
	full := map[string]map[string]string{
		"desec":        {"DESEC_TOKEN": "t"},
		"digitalocean": {"DO_AUTH_TOKEN": "t"},
		"gandi":        {"GANDIV5_PERSONAL_ACCESS_TOKEN": "t"},
		"hetzner":      {"HETZNER_API_TOKEN": "t"},
		"ovh":          {"OVH_ENDPOINT": "ovh-eu", "OVH_APPLICATION_KEY": "k", "OVH_APPLICATION_SECRET": "s", "OVH_CONSUMER_KEY": "c"},
		"porkbun":      {"PORKBUN_API_KEY": "pk1_k", "PORKBUN_SECRET_API_KEY": "sk1_s"},
	}
	for provider, env := range full {
		t.Run(provider, func(t *testing.T) {
			if err := CheckDNSProvider(provider, func(k string) string { return env[k] }); err != nil {
				t.Errorf("with every variable: %v", err)
			}
			for _, v := range DNSProviderVars(provider) {
				if _, ok := env[v.Name]; !ok {
					t.Errorf("DNSProviderVars lists %s, which the test does not set", v.Name)
				}
				err := CheckDNSProvider(provider, func(k string) string {
					if k == v.Name {
						return " "
					}
					return env[k]
				})
				want := fmt.Sprintf("dns provider %s needs %s (", provider, v.Name)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("without %s: %v, want an error containing %q", v.Name, err, want)
				}
			}
		})
	}
	for _, tc := range []struct{ endpoint, wantErr string }{
		{"ovh-ca", ""},
		{"https://eu.api.ovh.com/1.0", ""},
		{"ovh-mars", "OVH_ENDPOINT"},
		{"https://eu.api.ovh.com/1.0/", "OVH_ENDPOINT"},
		{"eu.api.ovh.com/1.0", "OVH_ENDPOINT"},
	} {
		env := map[string]string{"OVH_ENDPOINT": tc.endpoint, "OVH_APPLICATION_KEY": "k", "OVH_APPLICATION_SECRET": "s", "OVH_CONSUMER_KEY": "c"}
		err := CheckDNSProvider("ovh", func(k string) string { return env[k] })
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("OVH_ENDPOINT=%s: %v, want error %q", tc.endpoint, err, tc.wantErr)
		}
	}
}
