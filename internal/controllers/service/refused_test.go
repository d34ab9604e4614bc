package service

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// metalLBEvent is an event as MetalLB's controller writes it about the Service web
// (reason and source as in its convergeBalancer and its client's Errorf).
func metalLBEvent(name, source, message string, uid types.UID, at time.Time) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "apps", Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: "apps", Name: "web", UID: uid},
		Reason:         MetalLBAllocationFailedReason, Type: corev1.EventTypeWarning, Message: message,
		Source:        corev1.EventSource{Component: source},
		LastTimestamp: metav1.NewTime(at),
	}
}

// MetalLB's refusal of the addresses the provider handed it is relayed on the Service
// while MetalLB announces them not; nothing else is.
func TestMetalLBRefusalIsRelayed(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	const uid = types.UID("web-uid")
	now := time.Now()
	notAllowed := `Failed to allocate IP for "apps/web": ["83.118.128.5"] is not allowed in config`
	pairNotAllowed := `Failed to allocate IP for "apps/web": ["83.118.128.5" "2a05:1234::5"] is not allowed in config`
	oneOfTwo := `Failed to allocate IP for "apps/web": requested loadBalancer IP(s) ["83.118.128.5"] does not match the ipFamily of the service`
	for _, tc := range []struct {
		what    string
		handed  string
		ingress []string
		events  []client.Object
		// dual: the Service asks for both families; single: for IPv4 only; else for
		// those handed.
		dual, single bool
		want         string // the relayed event's start, "" for none
	}{
		{what: "MetalLB refuses the handed address", handed: "83.118.128.5",
			events: []client.Object{metalLBEvent("a", MetalLBController, notAllowed, uid, now)},
			want:   "Warning MetalLBRefused MetalLB refuses the addresses this provider handed it (83.118.128.5): " + notAllowed + "; check that"},
		{what: "MetalLB refuses the handed pair", handed: "83.118.128.5,2a05:1234::5",
			events: []client.Object{metalLBEvent("a", MetalLBController, pairNotAllowed, uid, now)},
			want:   "Warning MetalLBRefused MetalLB refuses the addresses this provider handed it (83.118.128.5,2a05:1234::5): " + pairNotAllowed},
		{what: "MetalLB announces the handed address (an old refusal)", handed: "83.118.128.5", ingress: []string{"83.118.128.5"},
			events: []client.Object{metalLBEvent("a", MetalLBController, notAllowed, uid, now)}},
		{what: "another component's AllocationFailed", handed: "83.118.128.5",
			events: []client.Object{metalLBEvent("a", "other-lb", notAllowed, uid, now)}},
		{what: "MetalLB's refusal of another Service of that name (an earlier one)", handed: "83.118.128.5",
			events: []client.Object{metalLBEvent("a", MetalLBController, notAllowed, "old-uid", now)}},
		{what: "MetalLB's refusal of the one address handed before the pair", handed: "83.118.128.5,2a05:1234::5",
			events: []client.Object{metalLBEvent("a", MetalLBController, oneOfTwo, uid, now)}},
		{what: "a Service switched to two families, its pair not handed yet", handed: "83.118.128.5", dual: true,
			events: []client.Object{metalLBEvent("a", MetalLBController, oneOfTwo, uid, now)}},
		{what: "a Service switched to one family, its one address not handed yet", handed: "83.118.128.5,2a05:1234::5", single: true,
			events: []client.Object{metalLBEvent("a", MetalLBController, pairNotAllowed, uid, now)}},
		{what: "MetalLB's newest refusal is about something else", handed: "83.118.128.5",
			events: []client.Object{
				metalLBEvent("a", MetalLBController, notAllowed, uid, now.Add(-time.Minute)),
				metalLBEvent("b", MetalLBController, `Failed to allocate IP for "apps/web": no available IPs`, uid, now),
			}},
		{what: "MetalLB's newest refusal names the handed address", handed: "83.118.128.5",
			events: []client.Object{
				metalLBEvent("a", MetalLBController, `Failed to allocate IP for "apps/web": ["10.0.0.1"] is not allowed in config`, uid, now.Add(-time.Minute)),
				metalLBEvent("b", MetalLBController, notAllowed, uid, now),
			},
			want: "Warning MetalLBRefused MetalLB refuses the addresses this provider handed it (83.118.128.5): " + notAllowed},
		{what: "nothing handed", events: []client.Object{metalLBEvent("a", MetalLBController, notAllowed, uid, now)}},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", UID: uid, Annotations: map[string]string{}}}
		if tc.handed != "" {
			svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation] = tc.handed
		}
		for _, ip := range tc.ingress {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		spec := &lbservice.Spec{}
		for _, a := range byFamily(tc.handed) {
			spec.Families = append(spec.Families, ipamapi.FamilyOf(netip.MustParseAddr(a)))
		}
		switch {
		case tc.dual:
			spec.Families = []ipamapi.Family{ipamapi.FamilyIPv4, ipamapi.FamilyIPv6}
		case tc.single:
			spec.Families = []ipamapi.Family{ipamapi.FamilyIPv4}
		}
		rec := events.NewFakeRecorder(4)
		r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(s).WithObjects(tc.events...).Build(), Recorder: rec}
		if err := r.checkRefused(t.Context(), svc, spec); err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		close(rec.Events)
		var got []string
		for e := range rec.Events {
			got = append(got, e)
		}
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s: relayed %q", tc.what, got)
		case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
			t.Errorf("%s: got %q, want one event starting %q", tc.what, got, tc.want)
		}
	}
}

// MetalLB's refusal event brings back the Service it is about; other events do not.
func TestMetalLBRefusalWakesItsService(t *testing.T) {
	web := metalLBEvent("a", MetalLBController, "", "web-uid", time.Now())
	other := metalLBEvent("b", "other-lb", "", "web-uid", time.Now())
	pod := metalLBEvent("c", MetalLBController, "", "web-uid", time.Now())
	pod.InvolvedObject.Kind = "Pod"
	if got := serviceOfRefusal(t.Context(), web); len(got) != 1 ||
		got[0] != (reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "apps", Name: "web"}}) {
		t.Errorf("MetalLB's event on Service apps/web: got %v", got)
	}
	for what, e := range map[string]*corev1.Event{"another component's": other, "MetalLB's on a Pod": pod} {
		if got := serviceOfRefusal(t.Context(), e); got != nil {
			t.Errorf("%s event: got %v", what, got)
		}
	}
}
