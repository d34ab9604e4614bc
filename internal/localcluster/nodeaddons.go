package localcluster

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/pkg/errors"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the node suite and make quickstart-node install on a node's control plane besides
// the provider: cert-manager from its chart, MetalLB from its manifest, and the quota
// that keeps Cluster API's own controllers from running.

// LinkPool is the part of the node's link that LoadBalancer addresses come from: the
// IPAM-API stand-in's zone (NodeZones) hands it out, MetalLB's pool on the node covers it
// (autoAssign false, as the provider's users set it), and its speaker announces it.
const LinkPool = "10.250.0.128/25"

// NodeZones is the IPAM-API stand-in's zone file for a node: hnet-private is LinkPool.
const NodeZones = `{"zones":[{"name":"hnet-private","ipv4":["` + LinkPool + `"],"ipv6":[]}]}`

// NodePathsFromEnv are the node's programs and images as make test-node and make
// quickstart-node set them (E2E_KUBELET, E2E_KUBE_PROXY, E2E_CNI, E2E_IMAGES); false when
// make did not.
func NodePathsFromEnv() (NodePaths, bool) {
	p := NodePaths{
		Kubelet: os.Getenv("E2E_KUBELET"), KubeProxy: os.Getenv("E2E_KUBE_PROXY"), CNI: os.Getenv("E2E_CNI"),
		Containerd: "containerd", Ctr: "ctr", Images: strings.Fields(os.Getenv("E2E_IMAGES")),
	}
	return p, p.Kubelet != ""
}

// InstallCertManager installs cert-manager's chart (E2E_CERT_MANAGER_CHART: its images
// are among the node's) in the namespace cert-manager, with its CRDs and without its
// start-up check Job (whose image is not built), and waits until its webhook admits an
// Issuer: its cainjector has put the webhook's CA in place.
func (c *ControlPlane) InstallCertManager(ctx context.Context) error {
	chart := os.Getenv("E2E_CERT_MANAGER_CHART")
	if chart == "" {
		return errors.New("E2E_CERT_MANAGER_CHART is not set: run through make, which copies cert-manager's chart into bin/")
	}
	if out, err := c.Helm("install", "cert-manager", chart, "--namespace", "cert-manager", "--create-namespace",
		"--set", "crds.enabled=true", "--set", "startupapicheck.enabled=false", "--wait", "--timeout", "3m"); err != nil {
		return errors.Wrapf(err, "helm install cert-manager:\n%s", out)
	}
	issuer := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
		"metadata": map[string]any{"namespace": "cert-manager", "name": "webhook-check"},
		"spec":     map[string]any{"selfSigned": map[string]any{}},
	}}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = c.Client.Create(ctx, issuer.DeepCopy(), client.DryRunAll)
		return last == nil, nil
	}); err != nil {
		return errors.Wrapf(WaitError(last, err), "cert-manager's webhook does not admit an Issuer")
	}
	return nil
}

// NoClusterAPIPods keeps Cluster API's own controllers, which clusterctl's first init
// installs besides the provider, from running on a node (their images are not built
// here): a ResourceQuota of no Pods in their namespaces, so the node never tries to pull
// their images. Init removes their webhook configurations.
func (c *ControlPlane) NoClusterAPIPods(ctx context.Context) error {
	for _, name := range []string{"capi-system", "capi-kubeadm-bootstrap-system", "capi-kubeadm-control-plane-system"} {
		if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); client.IgnoreAlreadyExists(err) != nil {
			return err
		}
		err := c.Client.Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "no-pods"},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
		})
		if client.IgnoreAlreadyExists(err) != nil {
			return err
		}
	}
	return nil
}

// InstallMetalLB applies MetalLB's manifest (E2E_METALLB_MANIFEST; its images are among
// the node's), waits until its controller and speaker are ready, and gives it LinkPool
// with an L2Advertisement, through its webhook.
func (c *ControlPlane) InstallMetalLB(ctx context.Context) error {
	manifest, err := os.ReadFile(os.Getenv("E2E_METALLB_MANIFEST"))
	if err != nil {
		return errors.Wrap(err, "E2E_METALLB_MANIFEST: run through make, which copies MetalLB's manifest into bin/")
	}
	if _, err := c.Apply(ctx, string(manifest)); err != nil {
		return err
	}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, ds := &appsv1.Deployment{}, &appsv1.DaemonSet{}
		if last = c.Client.Get(ctx, client.ObjectKey{Namespace: MetalLBNamespace, Name: "controller"}, d); last != nil {
			return false, nil
		}
		if last = c.Client.Get(ctx, client.ObjectKey{Namespace: MetalLBNamespace, Name: "speaker"}, ds); last != nil {
			return false, nil
		}
		if last = RolledOut(d); last != nil {
			last = errors.Wrap(last, "controller")
			return false, nil
		}
		last = errors.Errorf("speaker %d of %d ready", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
		return ds.Status.NumberReady == 1, nil
	}); err != nil {
		return errors.Wrap(WaitError(last, err), "MetalLB's controller and speaker are not ready")
	}
	pools := "---\napiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: node-link, namespace: metallb-system}\n" +
		"spec: {addresses: [" + LinkPool + "], autoAssign: false}\n" +
		"---\napiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: node-link, namespace: metallb-system}\n" +
		"spec: {ipAddressPools: [node-link]}\n"
	// Through MetalLB's webhook, once its controller has written its certificate.
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = c.Apply(ctx, pools)
		return last == nil, nil
	}); err != nil {
		return errors.Wrap(WaitError(last, err), "MetalLB's pool for the node's link")
	}
	return nil
}

// EchoApp is a backend for a LoadBalancer Service on a node: a Deployment of one Pod of
// the pause image answering every TCP connection on 8080 with its Pod's name and a
// newline, and a LoadBalancer Service "echo" in namespace to it on port 80.
func EchoApp(namespace string) (*appsv1.Deployment, *corev1.Service) {
	labels := map[string]string{"app": "echo"}
	backend := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "echo", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"/pause", "--answer", ":8080"},
					Ports:   []corev1.ContainerPort{{ContainerPort: 8080}},
				}}},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "echo"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: labels,
			Ports: []corev1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	return backend, svc
}

// WaitError is why a wait ended without success: the last error its condition saw, or,
// when it saw none (the context ended first), the wait's own; nil if the wait succeeded.
func WaitError(last, waited error) error {
	if waited == nil {
		return nil
	}
	if last != nil {
		return last
	}
	return waited
}

// RolledOut says why the Deployment is not rolled out (nil: it is): every replica it asks
// for is of its current template and Ready, as its controller saw its current generation.
func RolledOut(d *appsv1.Deployment) error {
	s, want := d.Status, int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if s.ObservedGeneration == d.Generation && s.Replicas == want && s.UpdatedReplicas == want && s.ReadyReplicas == want {
		return nil
	}
	return errors.Errorf("%d of %d replicas Ready, %d updated, %d in all (generation %d observed, %d current)",
		s.ReadyReplicas, want, s.UpdatedReplicas, s.Replicas, s.ObservedGeneration, d.Generation)
}
