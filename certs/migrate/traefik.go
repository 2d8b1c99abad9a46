package migrate

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// traefikResolver is one certificate resolver's entry in acme.json.
// encoding/json matches field names case-insensitively, so Traefik v1's
// "Certificates"/"Domain"/"Main"/"SANs" decode into the same fields as
// v2 and v3's "Certificates"/"domain"/"main"/"sans".
type traefikResolver struct {
	Certificates []struct {
		Domain struct {
			Main string   `json:"main"`
			SANs []string `json:"sans"`
		} `json:"domain"`
		// Base64 of the PEM text, as Go encodes []byte; decoded one by one
		// so that one bad entry refuses that certificate only.
		Certificate string `json:"certificate"`
		Key         string `json:"key"`
	} `json:"Certificates"`
}

// ReadTraefik returns the certificates of a Traefik acme.json: v2 and v3
// (an object per certificate resolver, each with Certificates), and v1
// (one Certificates list at the top). Candidates come in resolver-name
// order, then file order. An entry whose base64 does not decode is a
// Candidate with Err set; a file that is not such JSON is an error.
func ReadTraefik(data []byte) ([]Candidate, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("acme.json: %w", err)
	}
	resolvers := map[string]json.RawMessage{}
	for k, v := range top {
		if strings.EqualFold(k, "Certificates") {
			// Traefik v1: the file is one resolver.
			resolvers = map[string]json.RawMessage{"(v1)": data}
			break
		}
		resolvers[k] = v
	}
	names := make([]string, 0, len(resolvers))
	for k := range resolvers {
		names = append(names, k)
	}
	slices.Sort(names)
	var out []Candidate
	for _, name := range names {
		raw := resolvers[name]
		if string(raw) == "null" {
			continue
		}
		var r traefikResolver
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("acme.json resolver %q: %w", name, err)
		}
		for i, c := range r.Certificates {
			cand := Candidate{
				Source: fmt.Sprintf("resolver %s #%d", name, i+1),
				Names:  append([]string{c.Domain.Main}, c.Domain.SANs...),
			}
			var err error
			if cand.CertPEM, err = base64.StdEncoding.DecodeString(c.Certificate); err != nil {
				cand.Err = fmt.Errorf("%w: certificate is not base64: %v", ErrUnparsable, err)
			} else if cand.KeyPEM, err = base64.StdEncoding.DecodeString(c.Key); err != nil {
				cand.Err = fmt.Errorf("%w: key is not base64: %v", ErrUnparsable, err)
			}
			out = append(out, cand)
		}
	}
	return out, nil
}
