package main

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// The committed CRDs are what the generator writes, and serve only v1beta2 with no
// conversion webhook.
func TestCommittedCRDsAreFreshAndV1beta2Only(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	g.Expect(run(dir)).To(Succeed())
	for _, name := range crds {
		fresh, err := os.ReadFile(filepath.Join(dir, name))
		g.Expect(err).NotTo(HaveOccurred())
		committed, err := os.ReadFile(filepath.Join("..", "..", "config", "services", "capi-crds", name))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(committed)).To(Equal(string(fresh)), "%s is stale: run 'make manifests'", name)

		crd := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(yaml.Unmarshal(committed, crd)).To(Succeed())
		g.Expect(crd.Spec.Versions).To(HaveLen(1))
		g.Expect(crd.Spec.Versions[0].Name).To(Equal("v1beta2"))
		g.Expect(crd.Spec.Versions[0].Served && crd.Spec.Versions[0].Storage).To(BeTrue())
		g.Expect(crd.Spec.Conversion).To(BeNil())
	}
}
