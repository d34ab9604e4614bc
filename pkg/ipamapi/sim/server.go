package sim

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pkg/errors"
	"k8s.io/utils/clock"
)

const (
	contentTypeJSON = "application/json; charset=utf-8"
	contentTypeHTML = "text/html; charset=utf-8"
)

// CatchAllHTML is the body the real server (gin NoRoute handler) answers with HTTP 200
// and Content-Type "text/html; charset=utf-8" for every path and method that is not an
// API route — including DELETE /v2/cluster and GET /v2/address. Copied byte for byte
// from the vitistack/ipam-api routes.go (indentation included).
const CatchAllHTML = "\n\t\t<!DOCTYPE html>\n\t\t<html lang=\"en\">\n\t\t<head>\n\t\t\t<meta charset=\"UTF-8\">\n\t\t\t<title>Vitistack IPAM-API</title>\n\t\t</head>\n\t\t<body>\n\t\t\t<h1>Vitistack IPAM-API</h1>\n\t\t\t<p>Take a look at <a href=\"/swagger/index.html\">Swagger</a> for api docs.</p>\n\t\t</body>\n\t\t</html>\n\t"

// Server is the stand-in IPAM-API: an http.Handler with in-memory state.
//
// Fidelity notes (where ipam-api.md is silent the public vitistack/ipam-api source is
// followed; "Assumption" marks reconstructions):
//   - Decoding is gin's ShouldBindJSON (encoding/json, one value, unknown fields
//     ignored); validation order and messages are those of the real ValidateRequest.
//   - POST is lookup (is the triple registered? is the address in NetBox?), then the
//     injected latency, then commit — not serialised per identity, so overlapping
//     first POSTs of one triple get different addresses (the real concurrency trap).
//     Stats().OverlappingRegistrations counts such overlaps.
//   - Addresses are matched as exact strings; "present in NetBox" is decided on the
//     normalised IP, so a bare address is claimed (case C) and stored as ip/32 while
//     the answer echoes the bare form.
//   - On case B/D without rotation the real code rebuilds the holder list without
//     deny_external_cleanup (every holder reads false afterwards) and moves the
//     requesting holder to the end; reproduced.
//   - A path that differs from an API route only by a trailing slash gets gin's
//     RedirectTrailingSlash answer: 307 with Location and no body.
//   - NetBox error texts (duplicate prefix, non-host prefix) are approximations.
//   - Backend failures (Faults.NetBoxDown, PrefixesLoading, MongoDown and
//     Config.PrefixLoadDelay) follow "When its own dependencies fail" in
//     docs/ipam-api.md; their place in the order (after the body is decoded, NetBox
//     before any validation) follows the public handler and ValidateRequest.
type Server struct {
	zones     *zoneTable
	clock     clock.WithTicker
	interval  time.Duration
	log       *slog.Logger
	stateFile string

	mu        sync.Mutex // guards everything below up to fmu
	st        *store
	inflight  map[flightKey]int
	exhausted map[string]bool
	stats     Stats

	fmu    sync.Mutex // guards faults, rnd and prefixesReadyAt
	faults Faults
	rnd    *rand.Rand
	// prefixLoadDelay and prefixesReadyAt: Config.PrefixLoadDelay from start or Reset.
	prefixLoadDelay time.Duration
	prefixesReadyAt time.Time
}

// flightKey identifies registrations that the real server would race on: the same
// triple in the same zone and family. (Dual stack — one POST per family — is not an
// overlap.)
type flightKey struct {
	ref          ServiceRef
	zone, family string
}

// New returns a Server for cfg. It panics if cfg is invalid (bad zone CIDR, unreadable
// state file); use NewServer to get an error instead.
func New(cfg Config) *Server {
	s, err := NewServer(cfg)
	if err != nil {
		panic(err)
	}
	return s
}

// NewServer returns a Server for cfg, loading cfg.StateFile if it exists.
func NewServer(cfg Config) (*Server, error) {
	zones := cfg.Zones
	if len(zones) == 0 {
		zones = DefaultZones()
	}
	zt, err := compileZones(zones)
	if err != nil {
		return nil, errors.Wrap(err, "invalid zone configuration")
	}
	if cfg.PrefixLoadDelay < 0 {
		return nil, errors.New("negative prefix load delay")
	}
	s := &Server{
		zones:     zt,
		clock:     cfg.Clock,
		interval:  cfg.SweepInterval,
		log:       cfg.Logger,
		stateFile: cfg.StateFile,
		st:        newStore(),
		inflight:  map[flightKey]int{},
		exhausted: map[string]bool{},
		rnd:       newRand(cfg.RandSeed),

		prefixLoadDelay: cfg.PrefixLoadDelay,
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	s.prefixesReadyAt = s.clock.Now().Add(s.prefixLoadDelay)
	if s.interval <= 0 {
		s.interval = DefaultSweepInterval
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.stats = newStats()
	if err := s.SetLatency(cfg.Latency, cfg.LatencyJitter); err != nil {
		return nil, err
	}
	if s.stateFile != "" {
		st, err := LoadStateFile(s.stateFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, err
		default:
			if err := s.ImportState(st); err != nil {
				return nil, errors.Wrapf(err, "state file %s", s.stateFile)
			}
		}
	}
	return s, nil
}

// route maps a request to its route the way gin's router does (exact path, per
// method, RedirectTrailingSlash on, HandleMethodNotAllowed off).
func route(r *http.Request) (Route, string) {
	p := r.URL.Path
	routes := map[string]map[string]Route{
		http.MethodPost:   {"/v2/address": RouteRegister, "/": RouteLegacyRegister},
		http.MethodDelete: {"/v2/service": RouteRelease, "/": RouteLegacyRelease},
	}[r.Method]
	if rt, ok := routes[p]; ok {
		return rt, ""
	}
	if len(p) > 1 && strings.HasSuffix(p, "/") {
		if _, ok := routes[p[:len(p)-1]]; ok {
			return RouteRedirect, p[:len(p)-1]
		}
	}
	if _, ok := routes[p+"/"]; ok {
		return RouteRedirect, p + "/"
	}
	return RouteCatchAll, ""
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rt, redirectTo := route(r)
	// finish records statistics and the log line *before* the client can see the
	// outcome, so a test reading Stats() right after its call sees its request.
	finish := func(status int, outcome string) {
		s.record(rt, status, outcome)
		s.log.Info("request", "method", r.Method, "path", r.URL.Path, "route", string(rt),
			"status", status, "outcome", outcome, "duration", time.Since(start))
	}

	d := s.decide(rt)
	switch {
	case d.down:
		finish(0, "down")
		dropConn(w)
		return
	case d.dropBefore:
		finish(0, "dropped-before")
		dropConn(w)
		return
	case d.fail:
		sleep(d.latency)
		finish(d.status, "injected-error")
		w.Header().Set("Content-Type", d.ctype)
		w.WriteHeader(d.status)
		_, _ = w.Write([]byte(d.body))
		return
	}

	var resp response
	switch rt {
	case RouteRegister, RouteLegacyRegister:
		resp = s.register(r, d)
	case RouteRelease, RouteLegacyRelease:
		resp = s.release(r, d)
	case RouteRedirect:
		sleep(d.latency)
		u := *r.URL
		u.Path, u.RawPath = redirectTo, ""
		code := http.StatusMovedPermanently
		if r.Method != http.MethodGet {
			code = http.StatusTemporaryRedirect
		}
		finish(code, "redirect")
		http.Redirect(w, r, u.String(), code)
		return
	default:
		sleep(d.latency)
		resp = response{status: http.StatusOK, ctype: contentTypeHTML, body: []byte(CatchAllHTML)}
	}
	if d.dropAfter {
		finish(0, "dropped-after")
		dropConn(w)
		return
	}
	outcome := "answered"
	if resp.backend != "" {
		outcome = resp.backend
	}
	finish(resp.status, outcome)
	w.Header().Set("Content-Type", resp.ctype)
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

type response struct {
	status int
	ctype  string
	body   []byte
	// backend names the backend fault that produced the answer, if any (the outcome
	// in the log and Stats.BackendFailures).
	backend string
}

// Outcomes of answers produced by a backend fault.
const (
	outcomeNetBoxDown      = "netbox-down"
	outcomePrefixesLoading = "prefixes-loading"
	outcomeMongoDown       = "mongo-down"
)

// jsonResponse renders like gin's c.JSON: encoding/json.Marshal (HTML characters
// escaped as \u003c etc., no trailing newline), Content-Type application/json; charset=utf-8.
func jsonResponse(status int, message, address string) response {
	var v any = struct {
		Message string `json:"message"`
	}{message}
	if address != "" || status == http.StatusOK {
		v = struct {
			Message string `json:"message"`
			Address string `json:"address"`
		}{message, address}
	}
	b, err := json.Marshal(v)
	if err != nil { // cannot happen for two strings
		panic(err)
	}
	return response{status: status, ctype: contentTypeJSON, body: b}
}

func badRequest(msg string) response { return jsonResponse(http.StatusBadRequest, msg, "") }

// decodeAndValidate is the real handler up to its first MongoDB call: ShouldBindJSON,
// then ValidateRequest, which reads the zone list from NetBox before any check and
// consults the asynchronously loaded prefix cache last.
func (s *Server) decodeAndValidate(r *http.Request, b backendState) (*apiRequest, *response) {
	req, err := decodeRequest(r.Body)
	if err != nil {
		resp := badRequest(msgParseError)
		return nil, &resp
	}
	if b.netboxDown {
		resp := badRequest(prefixFetchZones + b.netboxBody)
		resp.backend = outcomeNetBoxDown
		return nil, &resp
	}
	if msg, loading := s.zones.validate(req, b.prefixesLoading); msg != "" {
		resp := badRequest(msg)
		if loading {
			resp.backend = outcomePrefixesLoading
		}
		return nil, &resp
	}
	return req, nil
}

type postCase int

const (
	caseA postCase = iota // allocate next free
	caseB                 // re-confirm the triple's address
	caseC                 // claim a specific address not present
	caseD                 // update/share a present address
)

func (s *Server) register(r *http.Request, d decision) response {
	latency := d.latency
	req, bad := s.decodeAndValidate(r, d.backend)
	if bad != nil {
		sleep(latency)
		return *bad
	}
	if d.backend.mongoDown && !s.mongoBack(latency+d.backend.mongoHang, d.backend.mongoRecovers) {
		// MongoDB ServiceAlreadyRegistered: server selection times out.
		resp := jsonResponse(http.StatusInternalServerError, prefixQueryFailed+MongoSelectionError, "")
		resp.backend = outcomeMongoDown
		return resp
	}
	sec := hashSecret(req.Secret)
	key := flightKey{ref: req.ref(), zone: req.Zone, family: req.IPFamily}

	// Lookup: MongoDB ServiceAlreadyRegistered and NetBox PrefixAvailable.
	s.mu.Lock()
	if s.inflight[key] > 0 {
		s.stats.OverlappingRegistrations++
	}
	s.inflight[key]++
	var c postCase
	address := req.Address
	switch held := s.st.findHeld(sec, req.Zone, req.IPFamily, req.ref()); {
	case req.Address == "" && held == nil:
		c = caseA
	case req.Address == "":
		c, address = caseB, held.address
	default:
		ip, host := parseClaim(req.Address, req.IPFamily)
		if host && ip.IsValid() && s.st.byIP[ip] != nil {
			c = caseD
		} else {
			c = caseC
		}
	}
	s.mu.Unlock()

	// The real server talks to NetBox here (slow, not serialised).
	sleep(latency)

	// Commit.
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if s.inflight[key]--; s.inflight[key] <= 0 {
			delete(s.inflight, key)
		}
	}()
	var (
		stored, reason, msg string
		answer              string
	)
	switch c {
	case caseA:
		stored, reason = s.allocate(req, sec)
		answer, msg = stored, msgRegistered
	case caseC:
		// Case C answers with the address as requested (bare stays bare), whatever it stored.
		_, reason = s.claim(req, sec)
		answer, msg = req.Address, msgRegistered
	default:
		stored, reason = s.update(req, sec, address)
		answer, msg = stored, msgUpdated
	}
	if reason != "" {
		return jsonResponse(http.StatusInternalServerError, prefixRegisterError+reason, "")
	}
	s.persistLocked()
	return jsonResponse(http.StatusOK, msg, answer)
}

func (s *Server) exhaustedReason(zone, family string) string {
	return "no available prefix found for zone " + zoneKey(zone, family)
}

// hasRoom is NetBox GetAvailablePrefixContainer: is there a container with room?
func (s *Server) hasRoom(zone, family string) bool {
	if s.exhausted[zoneKey(zone, family)] {
		return false
	}
	for _, p := range s.zones.containers[zone][family] {
		if _, ok := s.st.lowestFree(p); ok {
			return true
		}
	}
	return false
}

// allocate is case A: the lowest free host address of the first container with room.
func (s *Server) allocate(req *apiRequest, sec secretHash) (string, string) {
	if !s.exhausted[zoneKey(req.Zone, req.IPFamily)] {
		for _, p := range s.zones.containers[req.Zone][req.IPFamily] {
			if ip, ok := s.st.lowestFree(p); ok {
				rec := &record{address: hostPrefix(ip), ip: ip, zone: req.Zone, family: req.IPFamily, secret: sec,
					holders: []Holder{{ServiceRef: req.ref(), RetentionPeriodDays: req.Service.RetentionPeriodDays, DenyExternalCleanup: req.Service.DenyExternalCleanup}}}
				s.st.insert(rec)
				return rec.address, ""
			}
		}
	}
	return "", s.exhaustedReason(req.Zone, req.IPFamily)
}

// claim is case C (RegisterSpecific): the address must lie in a container of the zone,
// the zone must have a container with room, and NetBox must accept the prefix.
// new_secret is ignored, as in the real code.
func (s *Server) claim(req *apiRequest, sec secretHash) (string, string) {
	ip, host := parseClaim(req.Address, req.IPFamily)
	inZone := false
	for _, p := range s.zones.containers[req.Zone][req.IPFamily] {
		if ip.IsValid() && p.Contains(ip) {
			inZone = true
			break
		}
	}
	if !inZone {
		return "", reasonNotInZone
	}
	if !s.hasRoom(req.Zone, req.IPFamily) {
		return "", s.exhaustedReason(req.Zone, req.IPFamily)
	}
	if !host {
		// Assumption: NetBox would create a non-host prefix; the stand-in refuses.
		return "", `{"prefix":["stand-in: only host prefixes (/32, /128) can be claimed"]}`
	}
	if s.st.byIP[ip] != nil {
		// Lost a race with another claim of the same address (NetBox unique prefixes).
		return "", `{"prefix":["Duplicate prefix found in global table: ` + hostPrefix(ip) + `"]}`
	}
	rec := &record{address: hostPrefix(ip), ip: ip, zone: req.Zone, family: req.IPFamily, secret: sec,
		holders: []Holder{{ServiceRef: req.ref(), RetentionPeriodDays: req.Service.RetentionPeriodDays, DenyExternalCleanup: req.Service.DenyExternalCleanup}}}
	s.st.insert(rec)
	return rec.address, ""
}

// update is case B/D (UpdateAddressDocument), including secret rotation.
func (s *Server) update(req *apiRequest, sec secretHash, address string) (string, string) {
	rec := s.st.match(sec, req.Zone, address, req.IPFamily)
	if rec == nil {
		return "", reasonNoMatch
	}
	ref := req.ref()
	if req.NewSecret != "" {
		if newSec := hashSecret(req.NewSecret); newSec != sec {
			if len(rec.holders) > 1 {
				return "", reasonMultipleServices
			}
			if len(rec.holders) == 0 || rec.holders[0].ServiceRef != ref {
				return "", reasonServiceMismatch
			}
			rec.secret = newSec
			rec.holders = []Holder{{ServiceRef: ref, RetentionPeriodDays: req.Service.RetentionPeriodDays, DenyExternalCleanup: req.Service.DenyExternalCleanup}}
			return rec.address, ""
		}
	}
	holders := make([]Holder, 0, len(rec.holders)+1)
	for _, h := range rec.holders {
		if h.ServiceRef != ref {
			holders = append(holders, Holder{ServiceRef: h.ServiceRef, RetentionPeriodDays: h.RetentionPeriodDays, ExpiresAt: h.ExpiresAt})
		}
	}
	rec.holders = append(holders, Holder{ServiceRef: ref, RetentionPeriodDays: req.Service.RetentionPeriodDays})
	return rec.address, ""
}

func (s *Server) release(r *http.Request, d decision) response {
	req, bad := s.decodeAndValidate(r, d.backend)
	sleep(d.latency)
	if bad != nil {
		return *bad
	}
	if d.backend.mongoDown && !s.mongoBack(d.backend.mongoHang, d.backend.mongoRecovers) {
		// MongoDB FindOne in SetServiceExpirationOnAddress: server selection times out.
		resp := jsonResponse(http.StatusNotFound, prefixDeregisterError+prefixReadFailed+MongoSelectionError, "")
		resp.backend = outcomeMongoDown
		return resp
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.st.match(hashSecret(req.Secret), req.Zone, req.Address, req.IPFamily)
	if rec == nil {
		return jsonResponse(http.StatusNotFound, prefixDeregisterError+reasonNoMatchDelete, "")
	}
	ref := req.ref()
	if !rec.holds(ref) {
		return jsonResponse(http.StatusNotFound, prefixDeregisterError+reasonNoService, "")
	}
	holders := make([]Holder, 0, len(rec.holders))
	for _, h := range rec.holders {
		if h.ServiceRef != ref {
			holders = append(holders, h)
		}
	}
	exp := s.clock.Now().UTC().AddDate(0, 0, req.Service.RetentionPeriodDays)
	rec.holders = append(holders, Holder{ServiceRef: ref, RetentionPeriodDays: req.Service.RetentionPeriodDays,
		DenyExternalCleanup: req.Service.DenyExternalCleanup, ExpiresAt: &exp})
	s.persistLocked()
	return jsonResponse(http.StatusOK, msgExpirationSet, req.Address)
}

// Sweep runs the cleanup worker once: it drops every holder whose expires_at <= now
// and frees every address left without holders. It returns how many holders expired
// and how many addresses were freed.
func (s *Server) Sweep() (expiredHolders, freedAddresses int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	for _, rec := range s.st.sorted() {
		kept := rec.holders[:0:0]
		for _, h := range rec.holders {
			if h.ExpiresAt != nil && !h.ExpiresAt.After(now) {
				expiredHolders++
				continue
			}
			kept = append(kept, h)
		}
		rec.holders = kept
		if len(kept) == 0 {
			s.st.remove(rec)
			freedAddresses++
			if s.stats.Freed == nil {
				s.stats.Freed = map[string]int{}
			}
			s.stats.Freed[rec.address]++
		}
	}
	s.stats.Sweeps++
	s.stats.ExpiredHolders += expiredHolders
	s.stats.FreedAddresses += freedAddresses
	if expiredHolders > 0 || freedAddresses > 0 {
		s.persistLocked()
	}
	return expiredHolders, freedAddresses
}

// Run sweeps every SweepInterval (on the configured clock) until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	t := s.clock.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			s.Sweep()
		}
	}
}

// SweepInterval returns the configured sweep interval.
func (s *Server) SweepInterval() time.Duration { return s.interval }

// mongoBack waits out a request's MongoDB server selection (hang, real time) and reports
// whether MongoDB came back meanwhile (only with recovers: Faults.MongoRecovers): then the
// request goes on, late.
func (s *Server) mongoBack(hang time.Duration, recovers bool) bool {
	if !recovers {
		sleep(hang)
		return false
	}
	for deadline := time.Now().Add(hang); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		s.fmu.Lock()
		down := s.faults.MongoDown
		s.fmu.Unlock()
		if !down {
			return true
		}
	}
	return false
}

// sleep is the injected latency, in real time and not cancelled by the client going
// away: the real server finishes its NetBox and MongoDB calls regardless.
func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

// dropConn closes the client connection without an answer: hijack and close (HTTP/1),
// else abort the handler (HTTP/2 stream reset).
func dropConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler)
}
