package sim

import (
	"encoding/json"
	"net/http"
)

// DebugHandler serves the inspection API as JSON. It is not part of the real API and
// belongs on a separate listener:
//
//	GET  /registrations   []Registration
//	GET  /stats           Stats
//	GET  /faults          Faults (durations as "150ms")
//	PUT  /faults          replace Faults; answers the new setting
//	PUT  /exhausted       {"zone":"inet","ip_family":"ipv4","exhausted":true}
//	POST /sweep           run the sweeper now: {"expired_holders":N,"freed_addresses":M}
//	POST /reset           Reset()
func (s *Server) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /registrations", func(w http.ResponseWriter, _ *http.Request) {
		regs := s.Registrations()
		if regs == nil {
			regs = []Registration{}
		}
		writeDebug(w, http.StatusOK, regs)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		writeDebug(w, http.StatusOK, s.Stats())
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, _ *http.Request) {
		writeDebug(w, http.StatusOK, s.Faults())
	})
	mux.HandleFunc("PUT /faults", func(w http.ResponseWriter, r *http.Request) {
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
	})
	mux.HandleFunc("PUT /exhausted", func(w http.ResponseWriter, r *http.Request) {
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
	})
	mux.HandleFunc("POST /sweep", func(w http.ResponseWriter, _ *http.Request) {
		expired, freed := s.Sweep()
		writeDebug(w, http.StatusOK, map[string]int{"expired_holders": expired, "freed_addresses": freed})
	})
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		writeDebug(w, http.StatusOK, map[string]string{"status": "reset"})
	})
	return mux
}

func writeDebug(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
