package lbservice_test

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// A Service's ipam.vitistack.io annotations are user input: every problem names its
// annotation, and what parses without one is usable as it is (a known family, requested
// addresses of the families asked for, a retention the IPAM-API takes, a secret).
func FuzzParse(f *testing.F) {
	f.Add("inet", "ipv4", "83.118.168.4", "0", "false", "", "pool-a,pool-b", true)
	f.Add("inet", "dual", "10.0.0.1,2001:db8::1", "30", "true", "mine", "", true)
	f.Add("", "ipv6", "10.0.0.1", "-1", "yes", "", " , ", false)
	f.Add("hnet-private", "dual", "10.0.0.1,10.0.0.2", "31", "", "default", "", false)
	f.Add("inet", "IPv4", "10.0.0.1/32", "7 ", " true", "", "", true)
	f.Fuzz(func(t *testing.T, zone, family, addresses, retention, deny, secret, pools string, dualStack bool) {
		ann := map[string]string{
			ipamv1alpha1.ZoneAnnotation: zone, ipamv1alpha1.IPFamilyAnnotation: family, ipamv1alpha1.AddressesAnnotation: addresses,
			ipamv1alpha1.RetentionPeriodDaysAnnotation: retention, ipamv1alpha1.DenyExternalCleanupAnnotation: deny,
			ipamv1alpha1.SecretAnnotation: secret, ipamv1alpha1.PoolAnnotation: pools,
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
		if dualStack {
			policy := corev1.IPFamilyPolicyPreferDualStack
			svc.Spec.IPFamilyPolicy = &policy
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}
		spec, errs := lbservice.Parse(svc, "hnet-private")
		for _, e := range errs {
			if !strings.HasPrefix(e.Field, "metadata.annotations[ipam.vitistack.io/") || e.Error() == "" {
				t.Fatalf("an error that names no annotation: %q (%s)", e.Error(), e.Field)
			}
		}
		if len(errs) > 0 {
			return
		}
		if spec.Zone == "" || len(spec.Families) == 0 || spec.Secret == "" || spec.RetentionPeriodDays < 0 || spec.RetentionPeriodDays > 30 {
			t.Fatalf("accepted, but not usable: %+v", spec)
		}
		for fam, cidr := range spec.Addresses {
			p, err := netip.ParsePrefix(cidr)
			if err != nil || ipamapi.FamilyOf(p.Addr()) != fam || p.Bits() != p.Addr().BitLen() {
				t.Fatalf("accepted address %q for %s", cidr, fam)
			}
			found := false
			for _, f := range spec.Families {
				found = found || f == fam
			}
			if !found {
				t.Fatalf("accepted an %s address for families %v", fam, spec.Families)
			}
		}
		for _, p := range spec.Pools {
			if strings.TrimSpace(p) == "" || strings.Contains(p, ",") {
				t.Fatalf("pool %q", p)
			}
		}
	})
}
