package subnet_test

import (
	"net/netip"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
)

// A pool's subnet, gateway and excludedAddresses come from users: a plan that builds
// hands out only addresses inside the subnet, never the gateway, an excluded entry,
// the network address or (IPv4) the broadcast address, lowest first.
func FuzzNew(f *testing.F) {
	f.Add("10.0.0.0/29", "10.0.0.1", "10.0.0.2,10.0.0.4-10.0.0.5")
	f.Add("10.0.0.0/31", "", "")
	f.Add("2001:db8::/120", "2001:db8::1", "2001:db8::10/124")
	f.Add("10.0.0.1/24", "", "")
	f.Add("10.0.0.0/24", "x", "10.0.0.9-10.0.0.1")
	f.Add("192.168.0.0/30", "192.168.0.1", "192.168.0.2")
	f.Fuzz(func(t *testing.T, cidr, gateway, excluded string) {
		var ex []string
		if excluded != "" {
			ex = strings.Split(excluded, ",")
		}
		p, err := subnet.New(cidr, gateway, ex)
		if err != nil {
			return
		}
		prefix := netip.MustParsePrefix(cidr)
		never := map[netip.Addr]bool{prefix.Addr(): prefix.Bits() < prefix.Addr().BitLen()-1}
		if last := netipx.PrefixLastIP(prefix); last.Is4() && prefix.Bits() < 31 {
			never[last] = true // broadcast
		}
		if gw, err := netip.ParseAddr(gateway); err == nil {
			never[gw] = true
		}
		var taken []netip.Addr
		for range 8 {
			a, ok := p.Next(func(a netip.Addr) bool {
				for _, b := range taken {
					if a == b {
						return true
					}
				}
				return false
			})
			if !ok {
				break
			}
			if !prefix.Contains(a) || never[a] || !p.Usable(a) {
				t.Fatalf("%s gateway %q excluded %q: handed out %s", cidr, gateway, ex, a)
			}
			for _, e := range ex {
				if q, err := netip.ParsePrefix(e); err == nil && q.Contains(a) {
					t.Fatalf("%s: handed out %s, inside excluded %s", cidr, a, e)
				}
				if q, err := netip.ParseAddr(e); err == nil && q == a {
					t.Fatalf("%s: handed out excluded %s", cidr, a)
				}
			}
			if n := len(taken); n > 0 && !taken[n-1].Less(a) {
				t.Fatalf("%s: %s handed out after %s", cidr, a, taken[n-1])
			}
			taken = append(taken, a)
		}
		if p.Size() < int64(len(taken)) {
			t.Fatalf("%s: size %d, but %d handed out", cidr, p.Size(), len(taken))
		}
	})
}
