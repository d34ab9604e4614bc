package subnet

import (
	"math"
	"math/big"
	"net/netip"
	"strings"

	"github.com/pkg/errors"
	"go4.org/netipx"
)

// Plan is the set of addresses of a subnet that may be handed out.
type Plan struct {
	Prefix netip.Prefix
	usable *netipx.IPSet
}

// New builds the plan of a subnet with its gateway (may be empty) and excluded
// entries: addresses, CIDRs, or ranges "first-last".
func New(subnet, gateway string, excluded []string) (*Plan, error) {
	prefix, err := netip.ParsePrefix(subnet)
	if err != nil || prefix != prefix.Masked() {
		return nil, errors.Errorf("subnet %q is not a network in CIDR form", subnet)
	}
	var b netipx.IPSetBuilder
	b.AddPrefix(prefix)
	first := prefix.Addr()
	last := netipx.PrefixLastIP(prefix)
	switch {
	case first.Is4() && prefix.Bits() < 31:
		b.Remove(first) // network address
		b.Remove(last)  // broadcast address
	case first.Is6() && prefix.Bits() < 127:
		b.Remove(first) // subnet-router anycast address
	}
	if gateway != "" {
		gw, err := netip.ParseAddr(gateway)
		if err != nil {
			return nil, errors.Errorf("gateway %q is not an IP address", gateway)
		}
		b.Remove(gw)
	}
	for _, e := range excluded {
		switch {
		case strings.Contains(e, "-"):
			r, err := netipx.ParseIPRange(e)
			if err != nil {
				return nil, errors.Errorf("excluded range %q is not first-last", e)
			}
			b.RemoveRange(r)
		case strings.Contains(e, "/"):
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, errors.Errorf("excluded CIDR %q does not parse", e)
			}
			b.RemovePrefix(p)
		default:
			a, err := netip.ParseAddr(e)
			if err != nil {
				return nil, errors.Errorf("excluded address %q does not parse", e)
			}
			b.Remove(a)
		}
	}
	set, err := b.IPSet()
	if err != nil {
		return nil, errors.Wrap(err, "building the subnet's address set")
	}
	return &Plan{Prefix: prefix, usable: set}, nil
}

// Usable reports whether a may be handed out.
func (p *Plan) Usable(a netip.Addr) bool { return p.usable.Contains(a) }

// Next returns the lowest usable address for which taken is false.
func (p *Plan) Next(taken func(netip.Addr) bool) (netip.Addr, bool) {
	for _, r := range p.usable.Ranges() {
		for a := r.From(); ; a = a.Next() {
			if !taken(a) {
				return a, true
			}
			if a == r.To() {
				break
			}
		}
	}
	return netip.Addr{}, false
}

// Size is the number of usable addresses, capped at math.MaxInt64.
func (p *Plan) Size() int64 {
	total := new(big.Int)
	for _, r := range p.usable.Ranges() {
		from := new(big.Int).SetBytes(r.From().AsSlice())
		to := new(big.Int).SetBytes(r.To().AsSlice())
		total.Add(total, to.Sub(to, from).Add(to, big.NewInt(1)))
	}
	if !total.IsInt64() {
		return math.MaxInt64
	}
	return total.Int64()
}
