package localcluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pkg/errors"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

const (
	// ProviderLabel is the label clusterctl's components carry.
	ProviderLabel = "cluster.x-k8s.io/provider"
	// ProviderName is this provider's value of ProviderLabel (and its inventory name).
	ProviderName = "ipam-vitistack"
	// DeploymentName is the manager's Deployment as clusterctl installs it.
	DeploymentName = "capi-ipam-vitistack-controller-manager"
	// WebhookServiceName is the Service the installed webhook configurations name.
	WebhookServiceName = "capi-ipam-vitistack-webhook-service"
)

// removeForeignWebhooks deletes the webhook configurations of the other providers.
func (c *ControlPlane) removeForeignWebhooks(ctx context.Context) error {
	notOurs := client.MatchingLabelsSelector{}
	sel, err := labelsNot(ProviderLabel, ProviderName)
	if err != nil {
		return err
	}
	// Only a provider's: cert-manager's, installed beside them on a node, stay.
	provider, err := labels.NewRequirement(ProviderLabel, selection.Exists, nil)
	if err != nil {
		return err
	}
	notOurs.Selector = sel.Add(*provider)
	for _, obj := range []client.Object{&admissionv1.ValidatingWebhookConfiguration{}, &admissionv1.MutatingWebhookConfiguration{}} {
		if err := c.Client.DeleteAllOf(ctx, obj, notOurs); err != nil {
			return errors.Wrap(err, "removing the Cluster API providers' webhook configurations")
		}
	}
	return nil
}

// removeForeignConversions gives every CRD that names another provider's conversion
// webhook the conversion None. Nothing serves those webhooks here (the providers'
// Deployments never run on a control plane without nodes), and the API server would
// call the webhook's Service for every object it converts between versions: each call
// goes to the Service's ClusterIP, off this machine, and fails (tens of thousands of
// error lines in its log). The provider and the tests read and write v1beta2 only, the
// version the objects are stored in, so nothing is converted: None only relabels.
func (c *ControlPlane) removeForeignConversions(ctx context.Context) error {
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := c.Client.List(ctx, crds); err != nil {
		return errors.Wrap(err, "listing the CustomResourceDefinitions")
	}
	for i := range crds.Items {
		crd := &crds.Items[i]
		if conv := crd.Spec.Conversion; conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter || crd.Labels[ProviderLabel] == "" || crd.Labels[ProviderLabel] == ProviderName {
			continue
		}
		before := crd.DeepCopy()
		crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}
		if err := c.Client.Patch(ctx, crd, client.MergeFrom(before)); err != nil {
			return errors.Wrapf(err, "turning off the conversion webhook of %s", crd.Name)
		}
	}
	return nil
}

// writeWebhookCert writes (once) the serving certificate and CA the managers' webhook
// servers use.
func (c *ControlPlane) writeWebhookCert() error {
	if c.certDir != "" {
		return nil
	}
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return errors.Wrap(err, "generating the webhook serving certificate")
	}
	certDir := filepath.Join(c.Dir, "webhook-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return errors.Wrap(err, "creating the webhook certificate directory")
	}
	for name, data := range map[string][]byte{"tls.crt": crt, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			return errors.Wrapf(err, "writing the webhook certificate's %s", name)
		}
	}
	c.certDir, c.caBundle = certDir, crt
	return nil
}

// RouteWebhooks points this provider's installed webhook configurations at the last
// manager started (https://127.0.0.1:<its port>, with the CA it serves with), as envtest
// does. StartManager calls it once that manager is ready.
func (c *ControlPlane) RouteWebhooks(ctx context.Context) error {
	return c.routeWebhooks(ctx, c.webhookPort)
}

// RouteWebhooksTo points the webhook configurations at m, for when the manager started
// last is stopped and m runs on; configurations installed later are routed to m too.
func (c *ControlPlane) RouteWebhooksTo(ctx context.Context, m *Manager) error {
	c.webhookPort = m.webhookPort
	return c.RouteWebhooks(ctx)
}

func (c *ControlPlane) routeWebhooks(ctx context.Context, port int) error {
	return c.eachWebhook(ctx, "routing %s to 127.0.0.1", c.routeTo(port))
}

// routeTo changes a webhook's client config to call the manager serving on port.
func (c *ControlPlane) routeTo(port int) func(*admissionv1.WebhookClientConfig) {
	return func(cc *admissionv1.WebhookClientConfig) {
		path := ""
		switch {
		case cc.Service != nil && cc.Service.Path != nil:
			path = *cc.Service.Path
		case cc.URL != nil: // routed before (the manager is being restarted)
			if u, err := url.Parse(*cc.URL); err == nil {
				path = u.Path
			}
		}
		cc.Service = nil
		cc.URL = ptr.To(fmt.Sprintf("https://%s%s", hostPort(port), path))
		cc.CABundle = c.caBundle
	}
}

// UnrouteWebhooks points the webhook configurations back at the webhook Service, as
// they are installed, before Helm writes them again (an upgrade or a rollback applies
// them server-side, and a configuration with both a URL and a Service is invalid).
// Starting a manager routes them again.
func (c *ControlPlane) UnrouteWebhooks(ctx context.Context) error {
	return c.eachWebhook(ctx, "pointing %s at its Service again", func(cc *admissionv1.WebhookClientConfig) {
		if cc.URL == nil {
			return
		}
		path := ""
		if u, err := url.Parse(*cc.URL); err == nil {
			path = u.Path
		}
		cc.URL = nil
		cc.Service = &admissionv1.ServiceReference{Namespace: manager.ProviderNamespace, Name: WebhookServiceName, Path: &path}
	})
}

// eachWebhook changes the client config of every webhook of the provider's
// configurations with change, and updates them (what says what failed).
func (c *ControlPlane) eachWebhook(ctx context.Context, what string, change func(*admissionv1.WebhookClientConfig)) error {
	ours := client.MatchingLabels{ProviderLabel: ProviderName}
	// Validating and mutating configurations alike: every webhook's client config.
	vwcs, mwcs := &admissionv1.ValidatingWebhookConfigurationList{}, &admissionv1.MutatingWebhookConfigurationList{}
	var objs []client.Object
	for _, list := range []client.ObjectList{vwcs, mwcs} {
		if err := c.Client.List(ctx, list, ours); err != nil {
			return errors.Wrap(err, "listing the provider's webhook configurations")
		}
	}
	for i := range vwcs.Items {
		for j := range vwcs.Items[i].Webhooks {
			change(&vwcs.Items[i].Webhooks[j].ClientConfig)
		}
		objs = append(objs, &vwcs.Items[i])
	}
	for i := range mwcs.Items {
		for j := range mwcs.Items[i].Webhooks {
			change(&mwcs.Items[i].Webhooks[j].ClientConfig)
		}
		objs = append(objs, &mwcs.Items[i])
	}
	if len(objs) == 0 {
		return errors.New("no webhook configuration of the provider is installed")
	}
	for _, o := range objs {
		if err := c.Client.Update(ctx, o); err != nil {
			return errors.Wrapf(err, what, o.GetName())
		}
	}
	return nil
}

// Manager is the provider's manager binary running as a process.
type Manager struct {
	*Process
	// MetricsURL serves /metrics (plain HTTP on loopback).
	MetricsURL string

	webhookPort int
}

// StartManager runs the manager binary as the installed Deployment would run it: with
// the Deployment's arguments (as clusterctl substituted its variables) and as its
// ServiceAccount (impersonated), plus what running outside the cluster needs: the
// leader election Lease in the provider's namespace (a Pod finds it from its own),
// webhooks and probes on 127.0.0.1. extra arguments come last and win. Returns once the
// manager is ready (webhooks served); it reconciles once it leads. Two may run at once,
// as two replicas: the webhooks are routed to the last one started.
func (c *ControlPlane) StartManager(ctx context.Context, also io.Writer, extra ...string) (*Manager, error) {
	if err := c.writeWebhookCert(); err != nil {
		return nil, err
	}
	dep := &appsv1.Deployment{}
	if err := c.Client.Get(ctx, types.NamespacedName{Namespace: manager.ProviderNamespace, Name: DeploymentName}, dep); err != nil {
		return nil, errors.Wrap(err, "reading the manager's Deployment (was clusterctl init run?)")
	}
	args := []string{}
	for _, ctr := range dep.Spec.Template.Spec.Containers {
		if ctr.Name == "manager" {
			args = append(args, ctr.Args...)
		}
	}
	sa := dep.Spec.Template.Spec.ServiceAccountName
	if len(args) == 0 || sa == "" {
		return nil, errors.New("the manager's Deployment has no manager container arguments or no ServiceAccount")
	}
	kubeconfig := filepath.Join(c.Dir, "manager.kubeconfig")
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", manager.ProviderNamespace, sa),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + manager.ProviderNamespace, "system:authenticated"},
	}
	if err := clientcmd.WriteToFile(*KubeconfigFor(cfg, c.Name), kubeconfig); err != nil {
		return nil, errors.Wrap(err, "writing the manager's kubeconfig")
	}
	// One log per manager: manager.log, manager-2.log, ... (a start again on new ports
	// appends to the same).
	c.managers++
	name := "manager"
	if c.managers > 1 {
		name = fmt.Sprintf("manager-%d", c.managers)
	}
	// Each manager serves its webhooks on a port of its own: the last one's may have
	// been taken while no manager ran.
	var m *Manager
	err := onFreePorts(3, func(ports []int) error {
		webhook, health, metrics := ports[0], ports[1], ports[2]
		args := append(slices.Clone(args),
			"--leader-elect-namespace="+manager.ProviderNamespace,
			"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", webhook), "--webhook-cert-dir="+c.certDir,
			"--health-addr="+hostPort(health),
			"--diagnostics-address="+hostPort(metrics), "--insecure-diagnostics")
		args = append(args, extra...)
		proc, err := startProcess(c.Dir, name, also, []string{"KUBECONFIG=" + kubeconfig}, c.ManagerBinary, args...)
		if err != nil {
			return err
		}
		readyz := httpURL(health) + "/readyz"
		if err := waitFor(proc, time.Minute, "ready answer on "+readyz, func() error { return httpOK(ctx, readyz) }); err != nil {
			proc.Kill()
			return err
		}
		c.webhookPort = webhook
		if err := c.RouteWebhooks(ctx); err != nil {
			proc.Kill()
			return err
		}
		m = &Manager{Process: proc, MetricsURL: httpURL(metrics) + "/metrics", webhookPort: webhook}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// httpClient is for the local processes' plain HTTP endpoints; none takes long to answer.
var httpClient = &http.Client{Timeout: 10 * time.Second}

func httpOK(ctx context.Context, url string) error {
	_, err := Get(ctx, url)
	return err
}

// Get fetches url (a manager's metrics, say) and returns the body; an answer other
// than 200 OK is an error.
func Get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return "", errors.Wrapf(err, "GET %s", url)
	}
	defer resp.Body.Close() //nolint:errcheck // read-only
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
