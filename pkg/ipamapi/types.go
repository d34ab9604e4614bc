package ipamapi

import (
	"encoding/json"
	"net/netip"
	"strings"

	"github.com/pkg/errors"
)

// Family is an address family as the IPAM-API spells it.
type Family string

const (
	// FamilyIPv4 is "ipv4".
	FamilyIPv4 Family = "ipv4"
	// FamilyIPv6 is "ipv6".
	FamilyIPv6 Family = "ipv6"
)

// Secret is a value that owns addresses in the IPAM-API. It prints as [redacted] with
// every fmt verb and in JSON, so it cannot leak through logs or errors by accident;
// only the request encoder reads the value.
type Secret string

const redacted = "[redacted]"

// String implements fmt.Stringer.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer.
func (Secret) GoString() string { return redacted }

// MarshalJSON keeps the value out of any JSON but the request body.
func (Secret) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// Value returns the secret itself. Only put it on the wire.
func (s Secret) Value() string { return string(s) }

// Identity is the holder triple of the IPAM-API: who holds an address.
type Identity struct {
	ServiceName string `json:"serviceName"`
	NamespaceID string `json:"namespaceID"`
	ClusterID   string `json:"clusterID"`
}

// Request is the body of a registration or a release.
type Request struct {
	// Secret owns the address (8 to 64 characters).
	Secret Secret
	// NewSecret, when set on a registration with Address, rotates the secret.
	NewSecret Secret
	// Zone is the IPAM-API zone, for example "inet".
	Zone string
	// Family is ipv4 or ipv6.
	Family Family
	// Address is the address to claim, share or release. It is sent in canonical CIDR
	// form (ip/32 or ip/128) whatever form it is given in; empty asks for any address.
	Address string
	// Identity is the holder.
	Identity Identity
	// RetentionPeriodDays is how long the address is kept after a release (0-30).
	RetentionPeriodDays int
	// DenyExternalCleanup is stored by the IPAM-API.
	DenyExternalCleanup bool
}

// Response is the IPAM-API's answer to a successful request.
type Response struct {
	// Message is the server's message, for example "Address registered successfully".
	Message string
	// Address is the address in CIDR form.
	Address string
}

// Messages of successful answers.
const (
	// MessageRegistered answers a new allocation (cases A and C).
	MessageRegistered = "Address registered successfully"
	// MessageUpdated answers a re-registration or a share (cases B and D).
	MessageUpdated = "Address updated successfully"
	// MessageReleased answers a release.
	MessageReleased = "Service expiration set successfully"
)

// Updated reports whether the address was already held (cases B and D) rather than
// newly allocated.
func (r *Response) Updated() bool { return r.Message == MessageUpdated }

type wireService struct {
	ServiceName         string `json:"service_name"`
	NamespaceID         string `json:"namespace_id"`
	ClusterID           string `json:"cluster_id"`
	RetentionPeriodDays int    `json:"retention_period_days"`
	DenyExternalCleanup bool   `json:"deny_external_cleanup"`
}

type wireRequest struct {
	Secret    string      `json:"secret"`
	Zone      string      `json:"zone"`
	IPFamily  string      `json:"ip_family"`
	Address   string      `json:"address,omitempty"`
	NewSecret string      `json:"new_secret,omitempty"`
	Service   wireService `json:"service"`
}

type wireResponse struct {
	Message *string `json:"message"`
	Address string  `json:"address"`
}

func (r Request) body() ([]byte, error) {
	addr := ""
	if r.Address != "" {
		var err error
		if addr, err = CanonicalCIDR(r.Address); err != nil {
			return nil, err
		}
	}
	return json.Marshal(wireRequest{
		Secret:    r.Secret.Value(),
		Zone:      r.Zone,
		IPFamily:  string(r.Family),
		Address:   addr,
		NewSecret: r.NewSecret.Value(),
		Service: wireService{
			ServiceName:         r.Identity.ServiceName,
			NamespaceID:         r.Identity.NamespaceID,
			ClusterID:           r.Identity.ClusterID,
			RetentionPeriodDays: r.RetentionPeriodDays,
			DenyExternalCleanup: r.DenyExternalCleanup,
		},
	})
}

// CanonicalCIDR turns "10.0.0.1", "10.0.0.1/32", "2a05:1234::1" or "2a05:1234::1/128"
// into the host-CIDR form the IPAM-API stores ("10.0.0.1/32", "2a05:1234::1/128"). The
// IPAM-API matches addresses as exact strings, so every address must pass through here.
func CanonicalCIDR(s string) (string, error) {
	addr, err := ParseHost(s)
	if err != nil {
		return "", err
	}
	return netip.PrefixFrom(addr, addr.BitLen()).String(), nil
}

// ParseHost parses a bare address or a host CIDR (/32, /128) into an address.
func ParseHost(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, errors.Errorf("%q is not an IP address or host CIDR", s)
		}
		if p.Bits() != p.Addr().BitLen() {
			return netip.Addr{}, errors.Errorf("%q is not a single address: use /%d", s, p.Addr().BitLen())
		}
		return p.Addr(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, errors.Errorf("%q is not an IP address", s)
	}
	return a.Unmap(), nil
}

// FamilyOf returns the family of an address.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return FamilyIPv4
	}
	return FamilyIPv6
}
