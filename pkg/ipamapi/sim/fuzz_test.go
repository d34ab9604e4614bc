package sim_test

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// A zone file is the stand-in's outside input: one that loads names every zone and
// only containers of the right family, and the stand-in serving it hands out an
// address of the first zone from its containers.
func FuzzLoadZonesFile(f *testing.F) {
	f.Add("zones:\n- name: inet\n  ipv4: [83.118.168.0/22]\n  ipv6: ['2a05:1234::/64']\n")
	f.Add(`{"zones":[{"name":"lab","ipv4":["10.9.0.0/30"]}]}`)
	f.Add(`{"zones":[{"name":"a","ipv4":["10.0.0.0/8"]},{"name":"a"}]}`)
	f.Add("zones:\n- name: x\n  ipv4: ['2001:db8::/64']\n")
	f.Add("zones: []\n")
	f.Add("zones:\n- name: y\n  colour: blue\n")
	f.Add("zones:\n- name: z\n  ipv4: [10.0.0.1/32]\n")
	f.Fuzz(func(t *testing.T, raw string) {
		path := filepath.Join(t.TempDir(), "zones.yaml")
		if err := os.WriteFile(path, []byte(raw), 0o600); err != nil {
			t.Fatal(err)
		}
		zones, err := sim.LoadZonesFile(path)
		if err != nil {
			return
		}
		if len(zones) == 0 {
			t.Fatal("loaded no zones without an error")
		}
		z := zones[0]
		var containers []netip.Prefix
		for fam, cidrs := range map[ipamapi.Family][]string{ipamapi.FamilyIPv4: z.IPv4, ipamapi.FamilyIPv6: z.IPv6} {
			for _, c := range cidrs {
				p, err := netip.ParsePrefix(c)
				if err != nil || ipamapi.FamilyOf(p.Addr()) != fam {
					t.Fatalf("zone %q loaded with %s container %q", z.Name, fam, c)
				}
				if fam == ipamapi.FamilyIPv4 {
					containers = append(containers, p.Masked())
				}
			}
		}
		if z.Name == "" || len(containers) == 0 {
			return
		}
		srv := httptest.NewServer(sim.New(sim.Config{Zones: zones}))
		defer srv.Close()
		c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Register(context.Background(), ipamapi.Request{Secret: "a-secret-value", Zone: z.Name, Family: ipamapi.FamilyIPv4,
			Identity: ipamapi.Identity{ServiceName: "s", NamespaceID: "n", ClusterID: "c"}})
		if err != nil {
			return // a zone may be too small, or its name not one the API takes
		}
		got, err := netip.ParsePrefix(res.Address)
		inside := false
		for _, p := range containers {
			inside = inside || err == nil && p.Contains(got.Addr())
		}
		if !inside {
			t.Fatalf("zone %q %v: handed out %q", z.Name, containers, res.Address)
		}
	})
}
