package sim

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"time"

	"github.com/pkg/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"
)

// Family names as they appear on the wire.
const (
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

// DefaultSweepInterval is how often the real server's cleanup worker runs.
const DefaultSweepInterval = 30 * time.Second

// Zone is one zone of the IPAM-API with its ordered container prefixes per family.
// The order matters: allocation (case A) uses the first container that has room.
type Zone struct {
	Name string   `json:"name"`
	IPv4 []string `json:"ipv4,omitempty"`
	IPv6 []string `json:"ipv6,omitempty"`
}

// ZonesFile is the format of a zone file (YAML or JSON), e.g.
// {"zones":[{"name":"inet","ipv4":["83.118.168.0/22"],"ipv6":["2a05:1234::/64"]}]}.
type ZonesFile struct {
	Zones []Zone `json:"zones"`
}

// DefaultZones returns the production zone table of ipam-api.md, in the order the
// production "invalid zone" message lists them.
func DefaultZones() []Zone {
	return []Zone{
		{Name: "inet", IPv4: []string{"83.118.168.0/22"}, IPv6: []string{"2a05:1234::/64"}},
		{Name: "hnet-private", IPv4: []string{"10.0.0.0/8", "172.16.0.0/12"}},
		{Name: "hnet-public", IPv4: []string{"83.118.128.0/22", "91.186.80.0/20"}},
	}
}

// Config configures a Server. The zero value is the production-like default.
type Config struct {
	// Zones in the order used by the "invalid zone" message. Nil or empty means DefaultZones().
	Zones []Zone
	// SweepInterval of Run. Zero means DefaultSweepInterval.
	SweepInterval time.Duration
	// Clock drives expires_at and the sweeper ticker. Nil means the real clock.
	// Injected latency always uses real time, so a fake clock never blocks a request.
	Clock clock.WithTicker
	// Latency and LatencyJitter are the initial injected latency (see SetLatency).
	Latency       time.Duration
	LatencyJitter time.Duration
	// Logger receives one line per request (method, path, route, status, duration) and
	// state-file errors. Never secrets or bodies. Nil means no logging.
	Logger *slog.Logger
	// StateFile, if set, is loaded by NewServer (a missing file is an empty state) and
	// rewritten atomically (temp file + rename) after every change. It holds only
	// secret hashes.
	StateFile string
	// RandSeed seeds the random source used for jitter and fault rates; 0 means random.
	RandSeed uint64
	// PrefixLoadDelay is how long after NewServer (and after every Reset) the zone
	// containers count as not loaded yet, like the real server's asynchronous load at
	// start: validation answers 400 "no prefixes found for zone <zone> with IP family
	// <family>" for every zone (see Faults.PrefixesLoading). Measured on Clock. Zero
	// means loaded from the start.
	PrefixLoadDelay time.Duration
}

// LoadZonesFile reads a zone file in YAML or JSON (see ZonesFile) and checks it.
func LoadZonesFile(path string) ([]Zone, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.Wrapf(err, "reading zone file %s", path)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, errors.Wrapf(err, "parsing zone file %s", path)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var zf ZonesFile
	if err := dec.Decode(&zf); err != nil {
		return nil, errors.Wrapf(err, "decoding zone file %s", path)
	}
	if len(zf.Zones) == 0 {
		return nil, errors.Errorf("zone file %s defines no zones", path)
	}
	if _, err := compileZones(zf.Zones); err != nil {
		return nil, errors.Wrapf(err, "zone file %s", path)
	}
	return zf.Zones, nil
}

// zoneTable is the compiled zone configuration.
type zoneTable struct {
	order []string
	// containers[zone][family] in configured order.
	containers map[string]map[string][]netip.Prefix
}

func compileZones(zones []Zone) (*zoneTable, error) {
	zt := &zoneTable{containers: map[string]map[string][]netip.Prefix{}}
	for _, z := range zones {
		if z.Name == "" {
			return nil, errors.New("zone without a name")
		}
		if _, dup := zt.containers[z.Name]; dup {
			return nil, errors.Errorf("zone %q defined twice", z.Name)
		}
		fams := map[string][]netip.Prefix{}
		for fam, cidrs := range map[string][]string{FamilyIPv4: z.IPv4, FamilyIPv6: z.IPv6} {
			for _, c := range cidrs {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					return nil, errors.Wrapf(err, "zone %q: container %q", z.Name, c)
				}
				if (fam == FamilyIPv4) != p.Addr().Is4() {
					return nil, errors.Errorf("zone %q: container %q is not %s", z.Name, c, fam)
				}
				fams[fam] = append(fams[fam], p.Masked())
			}
		}
		zt.order = append(zt.order, z.Name)
		zt.containers[z.Name] = fams
	}
	return zt, nil
}

func newRand(seed uint64) *rand.Rand {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
