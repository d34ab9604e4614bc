package subnet

import (
	"math"
	"net/netip"
	"testing"

	. "github.com/onsi/gomega"
)

func firstN(g Gomega, p *Plan, n int) []string {
	taken := map[netip.Addr]bool{}
	var out []string
	for range n {
		a, ok := p.Next(func(a netip.Addr) bool { return taken[a] })
		if !ok {
			break
		}
		taken[a] = true
		out = append(out, a.String())
	}
	return out
}

func TestOrderAndSkips(t *testing.T) {
	cases := []struct {
		name, subnet, gateway string
		excluded              []string
		want                  []string
		size                  int64
	}{
		{"IPv4: no network, gateway, broadcast", "10.0.0.0/29", "10.0.0.1", nil,
			[]string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}, 5},
		{"IPv4: excluded address, CIDR and range", "10.0.0.0/28", "10.0.0.14",
			[]string{"10.0.0.2", "10.0.0.4/31", "10.0.0.7-10.0.0.12"}, []string{"10.0.0.1", "10.0.0.3", "10.0.0.6", "10.0.0.13"}, 4},
		{"IPv4 /31: both addresses", "10.0.0.0/31", "", nil, []string{"10.0.0.0", "10.0.0.1"}, 2},
		{"IPv4 /32: the one address", "10.0.0.7/32", "", nil, []string{"10.0.0.7"}, 1},
		{"IPv6: no subnet-router anycast address", "2a05:1234::100/125", "2a05:1234::101", nil,
			[]string{"2a05:1234::102", "2a05:1234::103", "2a05:1234::104", "2a05:1234::105", "2a05:1234::106", "2a05:1234::107"}, 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p, err := New(tc.subnet, tc.gateway, tc.excluded)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(firstN(g, p, 100)).To(Equal(tc.want))
			g.Expect(p.Size()).To(Equal(tc.size))
		})
	}
}

func TestHugeIPv6Subnet(t *testing.T) {
	g := NewWithT(t)
	p, err := New("2a05:1234::/64", "2a05:1234::1", []string{"2a05:1234::/65"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Size()).To(Equal(int64(math.MaxInt64)))
	a, ok := p.Next(func(netip.Addr) bool { return false })
	g.Expect(ok).To(BeTrue())
	g.Expect(a.String()).To(Equal("2a05:1234:0:0:8000::"))
}

func TestBadInput(t *testing.T) {
	for _, c := range [][]string{{"10.0.0.1/24", ""}, {"nope", ""}, {"10.0.0.0/24", "gw"}} {
		_, err := New(c[0], c[1], nil)
		NewWithT(t).Expect(err).To(HaveOccurred(), c[0])
	}
	_, err := New("10.0.0.0/24", "", []string{"10.0.0.9-x"})
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("first-last")))
}
