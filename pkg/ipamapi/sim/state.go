package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
)

// ServiceRef is the identity of a holder: the (service_name, namespace_id, cluster_id)
// triple, compared by exact string equality.
type ServiceRef struct {
	ServiceName string `json:"service_name"`
	NamespaceID string `json:"namespace_id"`
	ClusterID   string `json:"cluster_id"`
}

// Holder is one service holding an address.
type Holder struct {
	ServiceRef
	RetentionPeriodDays int  `json:"retention_period_days"`
	DenyExternalCleanup bool `json:"deny_external_cleanup"`
	// ExpiresAt is set by DELETE (now + retention_period_days of the DELETE body) and
	// cleared by a later POST of the same holder (case B/D). The sweeper drops the
	// holder once ExpiresAt <= now.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// State says whether the service still holds the address (HoldLive) or released it
	// and only retention keeps it until ExpiresAt (HoldExpiring). A nil ExpiresAt alone
	// reads as "live" only to someone who knows the stand-in, so the inspection API
	// spells it out. It is derived from ExpiresAt when Registrations, Registration,
	// Holders or HeldBy copy a record, and never stored: empty inside the registry and
	// absent from the state file.
	State HoldState `json:"state,omitempty"`
}

// HoldState is the derived state of a holder or of a whole registration.
type HoldState string

const (
	// HoldLive means the holder has not released the address (no expires_at). For a
	// registration: at least one holder is live.
	HoldLive HoldState = "live"
	// HoldExpiring means the holder released the address with DELETE; retention keeps it
	// until expires_at, and the first sweep after that drops it. A holder whose
	// expires_at has passed stays "expiring" until that sweep. For a registration:
	// every holder is expiring, so the sweeper frees the address after its ExpiresAt.
	HoldExpiring HoldState = "expiring"
)

// Registration is one address record as the real server keeps it in MongoDB, with the
// secret replaced by a fingerprint.
type Registration struct {
	// Address is the stored string (always ip/32 or ip/128 in canonical form).
	Address string `json:"address"`
	Zone    string `json:"zone"`
	Family  string `json:"ip_family"`
	// SecretFingerprint is Fingerprint(secret): a short hash, never the secret.
	SecretFingerprint string   `json:"secret_fingerprint"`
	Holders           []Holder `json:"holders"`
	// State summarises the holders, so a listing answers "is this address in use?"
	// without reading every holder: HoldLive if any holder is live, else HoldExpiring.
	// Derived like Holder.State, never stored.
	State HoldState `json:"state"`
	// ExpiresAt is set only when State is HoldExpiring: the latest expires_at of the
	// holders, after which the sweeper frees the address (unless a holder registers
	// again first).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Fingerprint returns the short, non-reversible fingerprint of a secret that
// Registration.SecretFingerprint shows: the first 12 hex characters of
// SHA-256(SHA-256(secret)). Tests can compare it with the fingerprint of the secret
// they sent.
func Fingerprint(secret string) string {
	return fingerprintOfHash(hashSecret(secret))
}

type secretHash [sha256.Size]byte

func hashSecret(secret string) secretHash { return sha256.Sum256([]byte(secret)) }

func fingerprintOfHash(h secretHash) string {
	f := sha256.Sum256(h[:])
	return hex.EncodeToString(f[:])[:12]
}

type record struct {
	seq     uint64
	address string
	ip      netip.Addr
	zone    string
	family  string
	secret  secretHash
	holders []Holder
}

func (r *record) holds(ref ServiceRef) bool {
	for _, h := range r.holders {
		if h.ServiceRef == ref {
			return true
		}
	}
	return false
}

// copyHolders returns a deep copy of the holders as stored (State empty), so callers
// cannot reach the registry through ExpiresAt.
func (r *record) copyHolders() []Holder {
	hs := make([]Holder, len(r.holders))
	for i, h := range r.holders {
		hs[i] = h
		hs[i].State = ""
		if h.ExpiresAt != nil {
			t := *h.ExpiresAt
			hs[i].ExpiresAt = &t
		}
	}
	return hs
}

// public is the copy the inspection API hands out: the holders with their derived
// State, and the registration's summary of them.
func (r *record) public() Registration {
	reg := Registration{Address: r.address, Zone: r.zone, Family: r.family, SecretFingerprint: fingerprintOfHash(r.secret),
		Holders: r.copyHolders(), State: HoldExpiring}
	for i := range reg.Holders {
		h := &reg.Holders[i]
		if h.ExpiresAt == nil {
			h.State = HoldLive
			reg.State = HoldLive
			continue
		}
		h.State = HoldExpiring
		if reg.ExpiresAt == nil || h.ExpiresAt.After(*reg.ExpiresAt) {
			t := *h.ExpiresAt
			reg.ExpiresAt = &t
		}
	}
	if reg.State == HoldLive {
		reg.ExpiresAt = nil
	}
	return reg
}

// store is the registry: MongoDB documents plus NetBox's set of allocated /32 and /128.
// Not safe for concurrent use; Server guards it with its mutex.
type store struct {
	seq    uint64
	byAddr map[string]*record     // exact stored string -> record
	byIP   map[netip.Addr]*record // allocated addresses (NetBox)
	used   []netip.Addr           // sorted allocated addresses, for lowest-free search
}

func newStore() *store {
	return &store{byAddr: map[string]*record{}, byIP: map[netip.Addr]*record{}}
}

// sorted returns the records in insertion order.
func (st *store) sorted() []*record {
	out := make([]*record, 0, len(st.byAddr))
	for _, r := range st.byAddr {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *record) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	return out
}

// findHeld is the real ServiceAlreadyRegistered: the first record (insertion order) with
// this secret, zone and family that lists the triple.
func (st *store) findHeld(sec secretHash, zone, family string, ref ServiceRef) *record {
	var best *record
	for _, r := range st.byAddr {
		if r.secret == sec && r.zone == zone && r.family == family && r.holds(ref) {
			if best == nil || r.seq < best.seq {
				best = r
			}
		}
	}
	return best
}

// match is the real MongoDB filter {secret, zone, address (exact string), ip_family}.
func (st *store) match(sec secretHash, zone, address, family string) *record {
	r := st.byAddr[address]
	if r == nil || r.secret != sec || r.zone != zone || r.family != family {
		return nil
	}
	return r
}

func (st *store) insert(r *record) {
	st.seq++
	r.seq = st.seq
	st.byAddr[r.address] = r
	st.byIP[r.ip] = r
	i, _ := slices.BinarySearchFunc(st.used, r.ip, netip.Addr.Compare)
	st.used = slices.Insert(st.used, i, r.ip)
}

func (st *store) remove(r *record) {
	delete(st.byAddr, r.address)
	delete(st.byIP, r.ip)
	if i, ok := slices.BinarySearchFunc(st.used, r.ip, netip.Addr.Compare); ok {
		st.used = slices.Delete(st.used, i, i+1)
	}
}

// lowestFree is NetBox's "first available /32 or /128" of one container: walk from the
// container's first address over the sorted used set. Cost is proportional to the run
// of used addresses at the start of the container, not to the container size.
func (st *store) lowestFree(p netip.Prefix) (netip.Addr, bool) {
	cand := p.Addr()
	i, _ := slices.BinarySearchFunc(st.used, cand, netip.Addr.Compare)
	for i < len(st.used) && st.used[i] == cand {
		cand = cand.Next()
		i++
		if !cand.IsValid() {
			return netip.Addr{}, false
		}
	}
	if !p.Contains(cand) {
		return netip.Addr{}, false
	}
	return cand, true
}

// hostPrefix returns the canonical stored form ip/32 or ip/128.
func hostPrefix(ip netip.Addr) string {
	return ip.String() + "/" + strconv.Itoa(ip.BitLen())
}

// parseClaim parses a case C/D request address into the IP NetBox would look up, and
// whether the (optional) suffix is the host length. Only called after validation, so
// the part before "/" parses.
func parseClaim(address, family string) (ip netip.Addr, hostLen bool) {
	base, suffix, hasSuffix := strings.Cut(address, "/")
	ip, err := netip.ParseAddr(base)
	if err != nil {
		// net.ParseIP accepted it but netip did not (e.g. leading zeros in IPv4).
		return netip.Addr{}, false
	}
	if family == FamilyIPv4 {
		ip = ip.Unmap()
	}
	if !hasSuffix {
		return ip, true
	}
	return ip, suffix == strconv.Itoa(ip.BitLen())
}

// State is the persisted form of the registry (the --state-file format). It holds only
// SHA-256 hashes of secrets.
type State struct {
	Version       int           `json:"version"`
	Registrations []StateRecord `json:"registrations"`
}

// StateRecord is one persisted address record.
type StateRecord struct {
	Address      string   `json:"address"`
	Zone         string   `json:"zone"`
	Family       string   `json:"ip_family"`
	SecretSHA256 string   `json:"secret_sha256"`
	Holders      []Holder `json:"holders"`
}

const stateVersion = 1

func (st *store) export() State {
	s := State{Version: stateVersion, Registrations: []StateRecord{}}
	for _, r := range st.sorted() {
		// copyHolders, not public: the derived State is not persisted.
		s.Registrations = append(s.Registrations, StateRecord{
			Address: r.address, Zone: r.zone, Family: r.family,
			SecretSHA256: hex.EncodeToString(r.secret[:]), Holders: r.copyHolders(),
		})
	}
	return s
}

func importStore(s State) (*store, error) {
	if s.Version != stateVersion {
		return nil, errors.Errorf("unsupported state version %d", s.Version)
	}
	st := newStore()
	for _, sr := range s.Registrations {
		p, err := netip.ParsePrefix(sr.Address)
		if err != nil || p.Bits() != p.Addr().BitLen() || hostPrefix(p.Addr()) != sr.Address {
			return nil, errors.Errorf("state record %q: not a canonical ip/32 or ip/128", sr.Address)
		}
		if _, dup := st.byIP[p.Addr()]; dup {
			return nil, errors.Errorf("state record %q: duplicate address", sr.Address)
		}
		raw, err := hex.DecodeString(sr.SecretSHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, errors.Errorf("state record %q: bad secret hash", sr.Address)
		}
		if len(sr.Holders) == 0 {
			continue // the sweeper would have freed it
		}
		r := &record{address: sr.Address, ip: p.Addr(), zone: sr.Zone, family: sr.Family, holders: slices.Clone(sr.Holders)}
		for i := range r.holders {
			// A "state" in a hand-edited file would be stale; public derives it again.
			r.holders[i].State = ""
		}
		copy(r.secret[:], raw)
		st.insert(r)
	}
	return st, nil
}
