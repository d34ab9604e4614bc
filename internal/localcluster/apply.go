package localcluster

import (
	"context"
	"io"
	"strings"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Apply applies every object of a multi-document YAML with server-side apply, as an
// administrator, and returns them ("Kind namespace/name").
func (c *ControlPlane) Apply(ctx context.Context, yaml string) ([]string, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(yaml), 4096)
	var applied []string
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return applied, nil
			}
			return applied, errors.Wrap(err, "decoding YAML")
		}
		if len(obj.Object) == 0 {
			continue
		}
		name := obj.GetKind() + " " + obj.GetName()
		if obj.GetNamespace() != "" {
			name = obj.GetKind() + " " + obj.GetNamespace() + "/" + obj.GetName()
		}
		if err := c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner("localcluster"), client.ForceOwnership); err != nil {
			return applied, errors.Wrapf(err, "applying %s", name)
		}
		applied = append(applied, name)
	}
}
