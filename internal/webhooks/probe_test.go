package webhooks

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// A pool whose subnet check has an address registered is not deleted before the
// provider has released it (the refusal says why and what to do); clusterctl move may.
func TestAPoolIsNotDeletedDuringItsSubnetCheck(t *testing.T) {
	w := &Pool{Kind: ipamv1alpha1.VitistackIPPoolKind} // no client: nothing is listed
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nodes",
		Annotations: map[string]string{ipamv1alpha1.SubnetProbeAnnotation: `{"address":"10.20.30.0/32"}`}}}
	_, err := w.ValidateDelete(context.Background(), pool)
	if err == nil {
		t.Fatal("deleting a pool during its subnet check was allowed")
	}
	for _, want := range []string{ipamv1alpha1.SubnetProbeAnnotation, "10.20.30.0/32", "try again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	pool.Annotations["clusterctl.cluster.x-k8s.io/delete-for-move"] = ""
	if _, err := w.ValidateDelete(context.Background(), pool); err != nil {
		t.Errorf("clusterctl move was refused: %v", err)
	}
}
