package claim_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// A claim's ipam.vitistack.io annotations are user input. Whatever they say, the claim
// ends bound to an address of its zone or Ready=False with a message and a Warning,
// and once it is deleted the IPAM-API holds nothing for it, nothing is bound twice and
// no Secret keeps a finalizer (the world's oracle).
func FuzzClaimAnnotations(f *testing.F) {
	f.Add("7", "true", "", "", "", "", false, false)
	f.Add("31", "maybe", "nope", "83.118.168.9", "", "", false, false)
	f.Add(" 0 ", "false", "default", "83.118.168.12,2a05:1234::1", "web", "other-cluster", true, true)
	f.Add("-1", "", "new", "10.50.0.3", "svc", "", true, false)
	f.Add("", "", "old", "", "", "", false, true)
	f.Fuzz(func(t *testing.T, retention, deny, secret, addresses, serviceName, clusterID string, overrides, subnet bool) {
		w := newWorld(t)
		pools(w)
		pool := "routed"
		if subnet {
			pool = "subnet"
		}
		if overrides {
			p := w.get(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: pool}}).(*ipamv1alpha1.VitistackIPPool)
			p.Spec.AllowIdentityOverrides = true
			must(t, w.direct.Update(w.ctx, p))
		}
		ann := map[string]string{}
		for k, v := range map[string]string{
			ipamv1alpha1.RetentionPeriodDaysAnnotation: retention, ipamv1alpha1.DenyExternalCleanupAnnotation: deny,
			ipamv1alpha1.SecretAnnotation: secret, ipamv1alpha1.AddressesAnnotation: addresses,
			ipamv1alpha1.ServiceNameAnnotation: serviceName, ipamv1alpha1.ClusterIDAnnotation: clusterID,
		} {
			if v != "" {
				ann[k] = v
			}
		}
		w.create(claimObj("c", pool, ann))
		w.run(4)
		got := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
		cond := readyOf(got)
		switch {
		case cond == nil:
			t.Fatalf("annotations %v: no Ready condition after four reconciles", ann)
		case cond.Status == metav1.ConditionTrue:
			if a := w.addressOf("c"); a == nil || a.Spec.Address == "" || got.Status.AddressRef.Name != "c" {
				t.Fatalf("annotations %v: Ready, but not bound", ann)
			}
		case strings.TrimSpace(cond.Message) == "":
			t.Fatalf("annotations %v: Ready=False %s without a message", ann, cond.Reason)
		default:
			warned := false
			for _, e := range w.drainEvents() {
				warned = warned || strings.HasPrefix(e, "Warning ")
			}
			if !warned {
				t.Fatalf("annotations %v: Ready=False %s %q without a Warning event", ann, cond.Reason, cond.Message)
			}
		}
		w.check()
		w.deleteClaims("c")
		w.settle()
		w.gone(t, "c")
		w.check()
	})
}
