package claim_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar/registrartest"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Claims under a Secret that is not protected yet (here the default Secret, created by
// the first claim) write their pending record, which asks for the protection, and
// wait, sending nothing: without a condition or an event, they ask the protector to
// look at the Secret (once between them), and would look again within seconds. The
// protector, once it has protected the Secret, wakes them (found by their records),
// and each binds with one patch of the claim (its record, with its attempt time), its
// IPAddress and one status patch.
func TestClaimsUnderANewSecretWaitForItsProtection(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.protector.Wake = &registrar.Queue{}
	wake := registrartest.Start(t, w.protector.Wake)
	asks := registrartest.Start(t, w.claims.Secrets.Protected.Ask)
	// An hour old: a claim that meets a new Secret late (its user changed its Secret,
	// say) waits as quietly as a new one.
	old := claimObj("a", "routed", nil)
	old.SetCreationTimestamp(metav1.NewTime(time.Now().Add(-time.Hour)))
	w.create(old)
	w.create(claimObj("b", "routed", nil))
	reconcile := func(name string) (ctrl.Result, error) {
		return w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: name}})
	}
	w.admit("a", "b")
	for _, n := range []string{"a", "b"} {
		// Waiting is a wait (logged as one, not as a reconcile error).
		if wait, err := waitOf(reconcile(n)); err != nil || wait <= 0 || wait > 2*time.Second {
			t.Fatalf("claim %s whose Secret is not protected was not told to look again within seconds: %v, %v", n, wait, err)
		}
		c := w.get(claimObj(n, "", nil)).(*ipamv1.IPAddressClaim)
		reg, err := record.OnClaim(c.Annotations)
		if err != nil || reg == nil || !reg.Attempt.IsZero() || len(c.Finalizers) == 0 {
			t.Fatalf("claim %s: record %+v (%v), finalizers %v; want its pending record, without an attempt time, and its finalizer",
				n, reg, err, c.Finalizers)
		}
		if r := readyOf(c); r != nil {
			t.Fatalf("claim %s has a Ready condition after a moment's wait: %+v", n, r)
		}
	}
	if evs := w.drainEvents(); len(evs) != 0 {
		t.Fatalf("waiting a moment for the Secret recorded events: %q", evs)
	}
	if n := w.api.Stats().Total(sim.RouteRegister); n != 0 {
		t.Fatalf("%d registrations sent under a Secret that is not protected", n)
	}
	if got := registrartest.Drain(asks); !slices.Equal(got, []types.NamespacedName{w.cfg.DefaultSecret}) {
		t.Fatalf("two claims waiting for Secret %s asked the protector to look at %v, want it once", w.cfg.DefaultSecret, got)
	}

	if _, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret}); err != nil {
		t.Fatal(err)
	}
	var woken []string
	for _, k := range registrartest.Drain(wake) {
		woken = append(woken, k.Name)
	}
	slices.Sort(woken)
	if !slices.Equal(woken, []string{"a", "b"}) {
		t.Fatalf("protecting the Secret woke %v, want the two claims that wait for it, [a b]", woken)
	}
	before := w.writes
	if _, err := reconcile("b"); err != nil {
		t.Fatal(err)
	}
	if w.addressOf("b") == nil {
		t.Fatalf("the claim is not bound once its Secret is protected:\n%s", w.describe())
	}
	if n := w.writes - before; n != 3 {
		t.Errorf("the claim was bound with %d writes, want 3 (its record, its IPAddress, its addressRef; Ready comes with the next reconcile)", n)
	}
	w.settle()
	if n := w.api.Stats().Total(sim.RouteRegister); n != 2 {
		t.Errorf("%d registration requests for two claims, want 2", n)
	}
	// A protector that finds the Secret protected anew (a new process's first look)
	// wakes no claim that waits for nothing.
	w.protector.Secrets.Protected.Set(w.cfg.DefaultSecret, nil)
	if _, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret}); err != nil {
		t.Fatal(err)
	}
	if woken := registrartest.Drain(wake); len(woken) != 0 {
		t.Fatalf("looking at the Secret again woke bound claims %v", woken)
	}
	w.check()
}

// A claim whose Secret the protector cannot protect (here a policy refuses the
// finalizer) waits quietly while it is young, as in any burst under a new Secret,
// looking again within seconds, then says why in its Ready condition and one event:
// the Secret, and the protector's error. It has sent nothing, writes nothing more while
// it waits (also when the protector's error changes), looks again less often the older
// it is, and binds once the protector gets through.
func TestAClaimSaysWhyItWaitsForItsSecret(t *testing.T) {
	w := newWorld(t)
	// Creation times are whole seconds: the claims' age is exact on this clock.
	clk := clocktesting.NewFakePassiveClock(time.Now().Truncate(time.Second))
	w.cfg.Clock = clk
	w.start()
	pools(w)
	// A webhook's refusal may quote the object it was sent (value, fingerprint and all)
	// and be long: the condition keeps the first KiB of it, with the Secret cut out.
	denied := true
	refusal := func(sec *corev1.Secret) string {
		body, err := json.Marshal(sec)
		must(t, err)
		return fmt.Sprintf("a policy forbids finalizers on Secrets (value %s, fingerprints %s): %s", sec.Data["secret"],
			sec.Annotations[ipamv1alpha1.SecretFingerprintsAnnotation], body) + strings.Repeat(", and says why at length", 1000)
	}
	w.protector.Client = interceptor.NewClient(w.c.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if sec, ok := obj.(*corev1.Secret); ok && denied {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, obj.GetName(), errors.New(refusal(sec)))
			}
			return c.Patch(ctx, obj, p, opts...)
		},
	})
	w.protector.Wake = &registrar.Queue{}
	wake := registrartest.Start(t, w.protector.Wake)
	names := []string{"a", "b"}
	for _, n := range names {
		w.create(claimObj(n, "routed", nil))
	}
	w.admit(names...)
	reconcile := func(name string) {
		t.Helper()
		wait, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: name}}))
		if err != nil || wait <= 0 || wait > 5*time.Second {
			t.Fatalf("claim %s whose Secret is not protected was not told to wait and look again within seconds: %v, %v", name, wait, err)
		}
	}
	claimNamed := func(name string) *ipamv1.IPAddressClaim {
		return w.get(claimObj(name, "", nil)).(*ipamv1.IPAddressClaim)
	}
	// leaks names the forms of the (default) Secret's value that text shows.
	leaks := func(text string) []string {
		sec := &corev1.Secret{}
		must(t, w.direct.Get(w.ctx, w.cfg.DefaultSecret, sec))
		value := sec.Data["secret"]
		var out []string
		for form, v := range map[string]string{"value": string(value), "base64": base64.StdEncoding.EncodeToString(value),
			"fingerprint": record.Fingerprint(value)} {
			if strings.Contains(text, v) {
				out = append(out, form)
			}
		}
		return out
	}
	protect := func() error {
		_, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret})
		if err != nil && len(leaks(err.Error())) > 0 {
			t.Fatalf("the protector's error (logged, and shown by waiting claims) has the Secret's %v: %.600s…", leaks(err.Error()), err)
		}
		return err
	}

	for range 4 { // at 0, 2.5, 5 and 7.5 s of age
		for _, n := range names {
			reconcile(n)
			if c := readyOf(claimNamed(n)); c != nil {
				t.Fatalf("claim %s has a Ready condition after a short wait: %+v", n, c)
			}
		}
		if protect() == nil {
			t.Fatal("the protector protected a Secret the policy keeps it from")
		}
		clk.SetTime(clk.Now().Add(2500 * time.Millisecond))
	}
	w.drainEvents()
	for _, n := range names {
		reconcile(n)
		c := readyOf(claimNamed(n))
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ipamv1alpha1.ClaimReadySecretNotProtectedReason ||
			!strings.Contains(c.Message, "provider/default") || !strings.Contains(c.Message, "a policy forbids finalizers on Secrets (value [redacted], fingerprints") {
			t.Fatalf("claim %s, waiting long for its Secret: Ready %+v, want False %s naming the Secret and the protector's error",
				n, c, ipamv1alpha1.ClaimReadySecretNotProtectedReason)
		}
		if len(c.Message) > 2048 || !strings.HasSuffix(c.Message, "…") {
			t.Fatalf("claim %s's message has %d bytes and does not end with the cut (…): the webhook's whole refusal", n, len(c.Message))
		}
	}
	evs := w.drainEvents()
	if len(evs) != 2 || !strings.HasPrefix(evs[0], "Warning "+ipamv1alpha1.ClaimReadySecretNotProtectedReason) {
		t.Fatalf("events %q, want one Warning %s per claim", evs, ipamv1alpha1.ClaimReadySecretNotProtectedReason)
	}
	for _, n := range names {
		if c := readyOf(claimNamed(n)); len(leaks(c.Message)) > 0 {
			t.Fatalf("claim %s's condition has the Secret's %v: %q", n, leaks(c.Message), c.Message)
		}
	}
	if l := leaks(strings.Join(evs, "\n")); len(l) > 0 {
		t.Fatalf("an event has the Secret's %v: %q", l, evs)
	}

	before := w.writes
	refusal = func(*corev1.Secret) string { return "the policy webhook timed out" }
	for range 2 {
		if protect() == nil {
			t.Fatal("the protector protected a Secret the policy keeps it from")
		}
		for _, n := range names {
			reconcile(n)
		}
	}
	if n := w.writes - before; n != 0 || len(w.drainEvents()) != 0 {
		t.Fatalf("waiting on (the protector's error changed) wrote %d times, or recorded events", n)
	}
	// The longer claims wait for the Secret, the less often they look again: a minute in,
	// every 30 s.
	clk.SetTime(clk.Now().Add(50 * time.Second))
	if wait, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "a"}})); err != nil || wait != 30*time.Second {
		t.Fatalf("a claim that waited a minute for its Secret comes back after %v (%v), want 30s", wait, err)
	}

	denied = false
	must(t, protect())
	if woken := registrartest.Drain(wake); len(woken) != 2 {
		t.Fatalf("protecting the Secret woke %v, want the 2 claims that wait for it", woken)
	}
	for _, n := range names {
		// The reconcile that binds it, and the one its addressRef brings, which says Ready.
		for range 2 {
			if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: n}}); err != nil {
				t.Fatal(err)
			}
		}
		if c := readyOf(claimNamed(n)); w.addressOf(n) == nil || c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("claim %s is not bound once its Secret is protected: Ready %+v\n%s", n, c, w.describe())
		}
	}
	w.settle()
	w.check()
}

// A refusing webhook may quote the Secret as it is stored when the protector's patch
// reaches it (admission comes before the optimistic lock's check). Here someone changed
// the value between the protector's read and its patch, and kubectl's
// last-applied-configuration holds an older value still: the protector's error, which
// is logged and shown by waiting claims, has neither.
func TestAProtectorRefusalQuotingTheSecretLeaksNoValue(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(claimObj("a", "routed", nil))
	w.admit("a")
	if _, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "a"}})); err != nil {
		t.Fatal(err)
	}
	now, applied := "changed-in-between-42", "applied-long-ago-17"
	w.protector.Client = interceptor.NewClient(w.c.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Secret); !ok {
				return c.Patch(ctx, obj, p, opts...)
			}
			stored := &corev1.Secret{}
			must(t, w.direct.Get(ctx, client.ObjectKeyFromObject(obj), stored))
			last, err := json.Marshal(&corev1.Secret{StringData: map[string]string{"secret": applied}})
			must(t, err)
			stored.Data["secret"] = []byte(now)
			stored.Annotations[corev1.LastAppliedConfigAnnotation] = string(last)
			must(t, w.direct.Update(ctx, stored))
			body, err := json.Marshal(stored)
			must(t, err)
			return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, obj.GetName(), fmt.Errorf("a policy forbids this: %s", body))
		},
	})
	_, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret})
	if err == nil || !strings.Contains(err.Error(), "a policy forbids this") || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("the protector's error does not say what the webhook refused, value cut out: %v", err)
	}
	for what, v := range map[string]string{"the value now": now, "the value last applied": applied} {
		if strings.Contains(err.Error(), v) || strings.Contains(err.Error(), base64.StdEncoding.EncodeToString([]byte(v))) {
			t.Errorf("the protector's error has %s: %v", what, err)
		}
	}
}
