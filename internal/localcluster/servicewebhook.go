package localcluster

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// InstallServiceWebhook applies the Service webhook's configuration of the release's
// Services flavour (ipam-components-workload.yaml, rendered with vars), as a user who
// turns the Service controller on (--enable-service-controller) on a management
// cluster installs it. It carries the provider's label, so it is routed to the local
// manager with the pool webhooks. It returns the configuration's name.
func (c *ControlPlane) InstallServiceWebhook(ctx context.Context, vars map[string]string) (string, error) {
	file := filepath.Join(c.paths.Repository, "ipam-vitistack", c.paths.Version, "ipam-components-workload.yaml")
	rendered, err := c.GenerateYAML(ctx, vars, file)
	if err != nil {
		return "", err
	}
	obj, err := serviceWebhookOf(rendered)
	if err != nil {
		return "", errors.Wrapf(err, "reading %s", file)
	}
	doc, err := yaml.Marshal(obj.Object)
	if err != nil {
		return "", err
	}
	if _, err = c.Apply(ctx, string(doc)); err != nil {
		return "", err
	}
	if c.webhookPort != 0 { // a manager runs: route the new configuration to it
		if err := c.RouteWebhooks(ctx); err != nil {
			return "", err
		}
	}
	return obj.GetName(), nil
}

// RemoveServiceWebhook deletes what InstallServiceWebhook applied.
func (c *ControlPlane) RemoveServiceWebhook(ctx context.Context, name string) error {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("admissionregistration.k8s.io/v1")
	obj.SetKind("ValidatingWebhookConfiguration")
	obj.SetName(name)
	return client.IgnoreNotFound(c.Client.Delete(ctx, obj))
}

// serviceWebhookOf returns the ValidatingWebhookConfiguration for Services out of a
// multi-document YAML.
func serviceWebhookOf(manifests string) (*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(manifests), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errors.New("it has no ValidatingWebhookConfiguration for Services")
			}
			return nil, err
		}
		if obj.GetKind() == "ValidatingWebhookConfiguration" && strings.Contains(obj.GetName(), "service") {
			return obj, nil
		}
	}
}
