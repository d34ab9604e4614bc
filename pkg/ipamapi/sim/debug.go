package sim

import (
	"encoding/json"
	"net/http"
	"strings"
)

// DebugRoute is one route of the inspection API (DebugHandler).
type DebugRoute struct {
	Method string
	Path   string
	// Doc says what the route takes and answers.
	Doc   string
	serve func(s *Server, w http.ResponseWriter, r *http.Request)
}

// DebugRoutes lists the routes of the inspection API, in the order of its
// documentation. DebugHandler serves exactly these; cmd/ipam-api-sim prints them in
// its help.
func DebugRoutes() []DebugRoute {
	return []DebugRoute{
		{Method: http.MethodGet, Path: "/registrations", Doc: `every address record, []Registration (secret fingerprints only); each holder and record has "state": "live" (held) or "expiring" (released, kept until "expires_at")`,
			serve: func(s *Server, w http.ResponseWriter, _ *http.Request) {
				regs := s.Registrations()
				if regs == nil {
					regs = []Registration{}
				}
				writeDebug(w, http.StatusOK, regs)
			}},
		{Method: http.MethodGet, Path: "/stats", Doc: "request counters, Stats",
			serve: func(s *Server, w http.ResponseWriter, _ *http.Request) {
				writeDebug(w, http.StatusOK, s.Stats())
			}},
		{Method: http.MethodGet, Path: "/faults", Doc: "the fault setting, Faults (durations as \"150ms\")",
			serve: func(s *Server, w http.ResponseWriter, _ *http.Request) {
				writeDebug(w, http.StatusOK, s.Faults())
			}},
		{Method: http.MethodPut, Path: "/faults", Doc: "replace the fault setting and answer it; fields: " + strings.Join(FaultFields(), ", "),
			serve: func(s *Server, w http.ResponseWriter, r *http.Request) {
				var f Faults
				if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
					writeDebug(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
					return
				}
				if err := s.SetFaults(f); err != nil {
					writeDebug(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
					return
				}
				writeDebug(w, http.StatusOK, s.Faults())
			}},
		{Method: http.MethodPut, Path: "/exhausted", Doc: `{"zone":"inet","ip_family":"ipv4","exhausted":true}: NetBox has no free address left in the zone`,
			serve: func(s *Server, w http.ResponseWriter, r *http.Request) {
				var in struct {
					Zone      string `json:"zone"`
					Family    string `json:"ip_family"`
					Exhausted bool   `json:"exhausted"`
				}
				if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Zone == "" || (in.Family != FamilyIPv4 && in.Family != FamilyIPv6) {
					writeDebug(w, http.StatusBadRequest, map[string]string{"error": "want {\"zone\":...,\"ip_family\":\"ipv4|ipv6\",\"exhausted\":bool}"})
					return
				}
				s.SetExhausted(in.Zone, in.Family, in.Exhausted)
				writeDebug(w, http.StatusOK, in)
			}},
		{Method: http.MethodPost, Path: "/sweep", Doc: `run the expiry sweeper now: {"expired_holders":N,"freed_addresses":M}`,
			serve: func(s *Server, w http.ResponseWriter, _ *http.Request) {
				expired, freed := s.Sweep()
				writeDebug(w, http.StatusOK, map[string]int{"expired_holders": expired, "freed_addresses": freed})
			}},
		{Method: http.MethodPost, Path: "/reset", Doc: "forget registrations, counters, faults and exhaustion; restart the prefix load delay",
			serve: func(s *Server, w http.ResponseWriter, _ *http.Request) {
				s.Reset()
				writeDebug(w, http.StatusOK, map[string]string{"status": "reset"})
			}},
	}
}

// DebugHandler serves the inspection API (DebugRoutes) as JSON. It is not part of the
// real API and belongs on a separate listener.
func (s *Server) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range DebugRoutes() {
		mux.HandleFunc(rt.Method+" "+rt.Path, func(w http.ResponseWriter, r *http.Request) { rt.serve(s, w, r) })
	}
	return mux
}

func writeDebug(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
