package localcluster

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pkg/errors"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// SetServiceWebhook turns the Service webhook of the management install on or off, as
// VITISTACK_SERVICES does (on: for a manager started with --enable-service-controller):
// it renders the release's ipam-components.yaml with vars and VITISTACK_SERVICES, and
// applies its Service webhook configuration (installed with the provider, calling nobody
// while off). While a manager runs, the configuration is applied routed to it: no
// configuration points at the webhook Service for a moment, when the API server would
// call the Service's ClusterIP, an address off this machine, for a write made meanwhile.
func (c *ControlPlane) SetServiceWebhook(ctx context.Context, vars map[string]string, on bool) error {
	file := filepath.Join(c.paths.Repository, "ipam-vitistack", c.paths.Version, "ipam-components.yaml")
	withServices := map[string]string{"VITISTACK_SERVICES": strconv.FormatBool(on)}
	for k, v := range vars {
		if k != "VITISTACK_SERVICES" {
			withServices[k] = v
		}
	}
	rendered, err := c.GenerateYAML(ctx, withServices, file)
	if err != nil {
		return err
	}
	obj, err := serviceWebhookOf(rendered)
	if err != nil {
		return errors.Wrapf(err, "reading %s", file)
	}
	if c.webhookPort != 0 {
		vwc := &admissionv1.ValidatingWebhookConfiguration{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, vwc); err != nil {
			return errors.Wrap(err, "reading the Service webhook configuration")
		}
		route := c.routeTo(c.webhookPort)
		for i := range vwc.Webhooks {
			route(&vwc.Webhooks[i].ClientConfig)
		}
		if obj.Object, err = runtime.DefaultUnstructuredConverter.ToUnstructured(vwc); err != nil {
			return err
		}
	}
	doc, err := yaml.Marshal(obj.Object)
	if err != nil {
		return err
	}
	_, err = c.Apply(ctx, string(doc))
	return err
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
