package pool

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// The readiness check's verdicts on the IPAM-API's answers: a zone the IPAM-API does not
// know is the user's to fix, unless the pool worked with it before (NetBox's zone list
// lacked it for a moment: the backend is failing); likewise a zone without prefixes.
func TestCheckZone(t *testing.T) {
	s := sim.New(sim.Config{})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	api, err := ipamapi.NewClient(srv.URL, ipamapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fresh := &ipamv1alpha1.VitistackIPPool{Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}}
	worked := fresh.DeepCopy()
	worked.Status.Conditions = []metav1.Condition{{Type: ipamv1alpha1.PoolReadyCondition, Status: metav1.ConditionTrue, Reason: ipamv1alpha1.PoolReadyReason}}
	tgt := target{reg: record.Registration{Endpoint: srv.URL, Zone: "inet", Family: ipamapi.FamilyIPv4,
		Identity: ipamapi.Identity{ClusterID: "cluster-a"}}, api: api, secret: "0123456789"}
	unknownZone := func() {
		if err := s.FailNext(1, 400, `{"message":"invalid zone 'inet', must be one of: 'inet', 'hnet-private', 'hnet-public'"}`); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		pool   ipamv1alpha1.Pool
		fault  func()
		reason string
		text   string
	}{
		{"accepted", fresh, func() {}, ipamv1alpha1.PoolReadyReason, "accepts zone inet, family ipv4"},
		{"an unknown zone, never worked", fresh, unknownZone, ipamv1alpha1.PoolReadyZoneRejectedReason, "fix spec.zone or spec.ipFamily"},
		{"an unknown zone that worked before", worked, unknownZone, ipamv1alpha1.PoolReadyBackendFailingReason, "did not know zone inet although the pool worked before"},
		{"no prefixes, worked before", worked, func() { s.SetPrefixesLoading(true) }, ipamv1alpha1.PoolReadyBackendFailingReason, "has no prefixes"},
	} {
		c.fault()
		got := checkZone(context.Background(), c.pool, tgt)
		s.SetPrefixesLoading(false)
		if got.reason != c.reason || !strings.Contains(got.message, c.text) {
			t.Errorf("%s: %s %q, want %s with %q", c.name, got.reason, got.message, c.reason, c.text)
		}
	}
}
