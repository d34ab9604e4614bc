package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// installServiceWebhook applies the Service webhook's configuration of the release's
// Services flavour (ipam-components-workload.yaml, rendered with vars). It carries the
// provider's label, so StartManager routes it to the local manager with the pool
// webhooks.
func installServiceWebhook(ctx context.Context, cp *localcluster.ControlPlane, paths localcluster.Paths, vars map[string]string) error {
	file := filepath.Join(paths.Repository, "ipam-vitistack", paths.Version, "ipam-components-workload.yaml")
	rendered, err := cp.GenerateYAML(ctx, vars, file)
	if err != nil {
		return err
	}
	doc, err := serviceWebhookOf(rendered)
	if err != nil {
		return errors.Wrapf(err, "reading %s", file)
	}
	_, err = cp.Apply(ctx, doc)
	return err
}

// serviceWebhookOf returns the ValidatingWebhookConfiguration for Services out of a
// multi-document YAML, as YAML.
func serviceWebhookOf(manifests string) (string, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(manifests), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return "", errors.New("it has no ValidatingWebhookConfiguration for Services")
			}
			return "", err
		}
		if obj.GetKind() != "ValidatingWebhookConfiguration" || !strings.Contains(obj.GetName(), "service") {
			continue
		}
		out, err := yaml.Marshal(obj.Object)
		return string(out), err
	}
}
