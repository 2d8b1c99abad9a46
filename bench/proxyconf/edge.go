package main

import "encoding/json"

// edgeRoutes is scafo-edge's routes file (its --routes-file): one route
// per application, each on one upstream of node "bench".
func (s *Setup) edgeRoutes() string {
	type upstream struct {
		Node    string `json:"node"`
		Address string `json:"address"`
	}
	type route struct {
		Host        string     `json:"host"`
		Application string     `json:"application"`
		Upstreams   []upstream `json:"upstreams"`
	}
	doc := struct {
		V      int     `json:"v"`
		Routes []route `json:"routes"`
	}{V: 1}
	for _, r := range s.Routes {
		doc.Routes = append(doc.Routes, route{Host: r.Host, Application: r.Name, Upstreams: []upstream{{Node: "bench", Address: r.Addr}}})
	}
	return marshal(doc)
}

// marshal is v as indented JSON, ending in a newline.
func marshal(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err) // only maps, slices and plain values: cannot fail
	}
	return string(b) + "\n"
}
