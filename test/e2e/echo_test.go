package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// secretEcho is an admission webhook, served by the test on loopback, that refuses
// the manager's changes to the Secrets of one namespace while it is on, and quotes the
// Secret in its refusal: the whole object as the API server sent it (the value
// base64'd in data, its fingerprint in the annotations) and the value itself. It is
// the worst echo a policy webhook can make, so that the canary scan has something to
// find should the manager's redaction ever let a value through to a log, a condition
// or an event.
type secretEcho struct {
	refusals atomic.Int64
	on       atomic.Bool
	name     string
}

// startSecretEcho serves the webhook and registers it for ns's Secrets; it is on.
func startSecretEcho(t *testing.T, ns string) *secretEcho {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	e := &secretEcho{name: "chaos-secret-echo-" + ns}
	e.on.Store(true)
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	pair, err := tls.X509KeyPair(crt, key)
	g.Expect(err).NotTo(HaveOccurred())
	srv := httptest.NewUnstartedServer(http.HandlerFunc(e.review))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: e.name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "secret-echo.chaos.test",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/"), CABundle: crt},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	g.Expect(a.Client.Create(ctx, cfg)).To(Succeed())
	t.Cleanup(func() { _ = client.IgnoreNotFound(a.Client.Delete(ctx, cfg)) })
	return e
}

// review refuses, while on, every change of a Secret by the manager's ServiceAccount,
// quoting the Secret.
func (e *secretEcho) review(w http.ResponseWriter, r *http.Request) {
	review := &admissionv1.AdmissionReview{}
	if err := json.NewDecoder(r.Body).Decode(review); err != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if e.on.Load() && strings.HasPrefix(req.UserInfo.Username, "system:serviceaccount:"+manager.ProviderNamespace+":") {
		sec := &corev1.Secret{}
		_ = json.Unmarshal(req.Object.Raw, sec)
		e.refusals.Add(1)
		resp.Allowed = false
		resp.Result = &metav1.Status{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: fmt.Sprintf("chaos policy refuses changes to Secrets: value %q, object %s", sec.Data["secret"], req.Object.Raw)}
	}
	review.Response = resp
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(review)
}
