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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
// the first claim) protect it themselves once their record names it: the first claim
// lists the Secret in the ledger, gives it the finalizer and the fingerprint of its
// value, and binds in the same reconcile, without a condition or an event; the next
// claim finds it protected and binds with three writes (its record, its IPAddress, its
// addressRef), writing nothing to the Secret. The protector then finds nothing to do.
func TestClaimsUnderANewSecretProtectItThemselves(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.protector.Wake = &registrar.Queue{}
	wake := registrartest.Start(t, w.protector.Wake)
	w.create(claimObj("a", "routed", nil))
	w.create(claimObj("b", "routed", nil))
	w.admit("a", "b")
	reconcile := func(name string) {
		t.Helper()
		if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: name}}); err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
	}
	reconcile("a")
	if w.addressOf("a") == nil {
		t.Fatalf("the first claim under a new Secret is not bound by its first reconcile:\n%s", w.describe())
	}
	sec := &corev1.Secret{}
	must(t, w.direct.Get(w.ctx, w.cfg.DefaultSecret, sec))
	if !slices.Contains(sec.Finalizers, ipamv1alpha1.SecretInUseFinalizer) ||
		record.Fingerprints(sec.Annotations)["secret"] != record.Fingerprint(sec.Data["secret"]) {
		t.Fatalf("the Secret a claim registered under: finalizers %v, fingerprints %v; want %s and the fingerprint of its value",
			sec.Finalizers, record.Fingerprints(sec.Annotations), ipamv1alpha1.SecretInUseFinalizer)
	}
	listed, err := w.protector.Ledger.List(w.ctx)
	must(t, err)
	if !slices.Contains(listed, w.cfg.DefaultSecret) {
		t.Fatalf("the ledger lists %v, not the Secret the claim protected (%s): a new leader would not look at it again", listed, w.cfg.DefaultSecret)
	}
	version, before := sec.ResourceVersion, w.writes
	reconcile("b")
	if w.addressOf("b") == nil {
		t.Fatalf("the second claim is not bound:\n%s", w.describe())
	}
	if n := w.writes - before; n != 3 {
		t.Errorf("the claim was bound with %d writes, want 3 (its record, its IPAddress, its addressRef; Ready comes with the next reconcile)", n)
	}
	must(t, w.direct.Get(w.ctx, w.cfg.DefaultSecret, sec))
	if sec.ResourceVersion != version {
		t.Errorf("the second claim wrote the Secret that was protected already")
	}
	if evs := w.drainEvents(); len(evs) != 0 {
		t.Fatalf("binding under a new Secret recorded events: %q", evs)
	}
	before = w.writes
	if _, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret}); err != nil {
		t.Fatal(err)
	}
	if n := w.writes - before; n != 0 {
		t.Errorf("the protector wrote %d times after the claims protected their Secret, want 0", n)
	}
	if woken := registrartest.Drain(wake); len(woken) != 0 {
		t.Errorf("the protector woke %v; no claim waits for it", woken)
	}
	w.settle()
	if n := w.api.Stats().Total(sim.RouteRegister); n != 2 {
		t.Errorf("%d registration requests for two claims, want 2", n)
	}
	w.check()
}

// refuseSecretPatches makes a policy refuse every patch of a Secret that c makes while
// *denied, quoting the Secret it was sent (value, fingerprint and all) at length.
func refuseSecretPatches(c client.Client, denied *bool, why func(*corev1.Secret) string) client.Client {
	return interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if sec, ok := obj.(*corev1.Secret); ok && *denied {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, obj.GetName(), errors.New(why(sec)))
			}
			return c.Patch(ctx, obj, p, opts...)
		},
	})
}

// A claim whose Secret cannot be protected (here a policy refuses the finalizer) sends
// nothing and says why in its Ready condition and one event: the Secret, and the
// refusal, with the Secret's value, base64 and fingerprint cut out and the rest cut to a
// KiB. It writes nothing more while the refusal goes on (also when its text changes),
// comes back with back-off, and binds once the policy lets the protection through.
func TestAClaimSaysWhyItsSecretCannotBeProtected(t *testing.T) {
	w := newWorld(t)
	pools(w)
	denied := true
	refusal := func(sec *corev1.Secret) string {
		body, err := json.Marshal(sec)
		must(t, err)
		return fmt.Sprintf("a policy forbids finalizers on Secrets (value %s, fingerprints %s): %s", sec.Data["secret"],
			sec.Annotations[ipamv1alpha1.SecretFingerprintsAnnotation], body) + strings.Repeat(", and says why at length", 1000)
	}
	w.claims.Secrets.Writer = refuseSecretPatches(w.c, &denied, func(sec *corev1.Secret) string { return refusal(sec) })
	names := []string{"a", "b"}
	for _, n := range names {
		w.create(claimObj(n, "routed", nil))
	}
	w.admit(names...)
	reconcile := func(name string) error {
		t.Helper()
		wait, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: name}}))
		if err == nil || wait != 0 {
			t.Fatalf("claim %s whose Secret cannot be protected: wait %v, error %v; want an error (retried with back-off)", name, wait, err)
		}
		return err
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
	for _, n := range names {
		if err := reconcile(n); len(leaks(err.Error())) > 0 {
			t.Fatalf("claim %s's error (logged) has the Secret's %v", n, leaks(err.Error()))
		}
		c := readyOf(claimNamed(n))
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ipamv1alpha1.ClaimReadySecretNotProtectedReason ||
			!strings.Contains(c.Message, "provider/default") || !strings.Contains(c.Message, "a policy forbids finalizers on Secrets (value [redacted], fingerprints") {
			t.Fatalf("claim %s: Ready %+v, want False %s naming the Secret and the refusal", n, c, ipamv1alpha1.ClaimReadySecretNotProtectedReason)
		}
		if len(c.Message) > 2048 || !strings.HasSuffix(c.Message, "…") {
			t.Fatalf("claim %s's message has %d bytes and does not end with the cut (…): the webhook's whole refusal", n, len(c.Message))
		}
		if l := leaks(c.Message); len(l) > 0 {
			t.Fatalf("claim %s's condition has the Secret's %v: %q", n, l, c.Message)
		}
	}
	evs := w.drainEvents()
	if len(evs) != 2 || !strings.HasPrefix(evs[0], "Warning "+ipamv1alpha1.ClaimReadySecretNotProtectedReason) {
		t.Fatalf("events %q, want one Warning %s per claim", evs, ipamv1alpha1.ClaimReadySecretNotProtectedReason)
	}
	if l := leaks(strings.Join(evs, "\n")); len(l) > 0 {
		t.Fatalf("an event has the Secret's %v: %q", l, evs)
	}
	if n := w.api.Stats().Total(sim.RouteRegister); n != 0 {
		t.Fatalf("%d registrations sent under a Secret that is not protected", n)
	}

	before := w.writes
	refusal = func(*corev1.Secret) string { return "the policy webhook timed out" }
	for range 2 {
		for _, n := range names {
			reconcile(n)
		}
	}
	if n := w.writes - before; n != 0 || len(w.drainEvents()) != 0 {
		t.Fatalf("going on failing (the refusal's text changed) wrote %d times, or recorded events", n)
	}

	denied = false
	for _, n := range names {
		// The reconcile that binds it, and the one its addressRef brings, which says Ready.
		for range 2 {
			if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: n}}); err != nil {
				t.Fatal(err)
			}
		}
		if c := readyOf(claimNamed(n)); w.addressOf(n) == nil || c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("claim %s is not bound once its Secret can be protected: Ready %+v\n%s", n, c, w.describe())
		}
	}
	w.settle()
	w.check()
}

// A refusing webhook may quote the Secret as it is stored when a patch of its protection
// reaches it (admission comes before the optimistic lock's check). Here someone changed
// the value between the read and the patch, and kubectl's last-applied-configuration
// holds an older value still: neither the protector's error, which is logged, nor a
// claim's (logged, and in its condition) has any of the three values.
func TestARefusalQuotingTheSecretLeaksNoValue(t *testing.T) {
	for _, who := range []string{"the protector", "a claim"} {
		t.Run(who, func(t *testing.T) {
			w := newWorld(t)
			pools(w)
			first, now, applied := "the-value-at-first-7", "changed-in-between-42", "applied-long-ago-17"
			w.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.cfg.DefaultSecret.Namespace, Name: w.cfg.DefaultSecret.Name,
				Annotations: map[string]string{}}, Data: map[string][]byte{"secret": []byte(first)}})
			changeAndRefuse := interceptor.NewClient(w.c.(client.WithWatch), interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
					if _, ok := obj.(*corev1.Secret); !ok {
						return c.Patch(ctx, obj, p, opts...)
					}
					stored := &corev1.Secret{}
					must(t, w.direct.Get(ctx, client.ObjectKeyFromObject(obj), stored))
					last, err := json.Marshal(&corev1.Secret{StringData: map[string]string{"secret": applied}})
					must(t, err)
					stored.Data["secret"] = []byte(now)
					if stored.Annotations == nil {
						stored.Annotations = map[string]string{}
					}
					stored.Annotations[corev1.LastAppliedConfigAnnotation] = string(last)
					must(t, w.direct.Update(ctx, stored))
					body, err := json.Marshal(stored)
					must(t, err)
					return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, obj.GetName(),
						fmt.Errorf("a policy forbids this: %s, was %s", body, first))
				},
			})
			var text string
			if who == "the protector" {
				w.protector.Client = changeAndRefuse
				_, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret})
				if err != nil {
					text = err.Error()
				}
			} else {
				w.claims.Secrets.Writer = changeAndRefuse
				w.create(claimObj("a", "routed", nil))
				w.admit("a")
				_, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "a"}})
				if c := readyOf(w.get(claimObj("a", "", nil)).(*ipamv1.IPAddressClaim)); err != nil && c != nil {
					text = err.Error() + "\n" + c.Message
				}
			}
			if !strings.Contains(text, "a policy forbids this") || !strings.Contains(text, "[redacted]") {
				t.Fatalf("%s's error does not say what the webhook refused, values cut out: %q", who, text)
			}
			for what, v := range map[string]string{"the value read": first, "the value now": now, "the value last applied": applied} {
				if strings.Contains(text, v) || strings.Contains(text, base64.StdEncoding.EncodeToString([]byte(v))) {
					t.Errorf("%s's error has %s: %s", who, what, text)
				}
			}
		})
	}
}
