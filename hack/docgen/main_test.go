package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docs/pool-api.md is what docgen writes from the CRDs in the repository: a field, a
// default or a rule changed in the Go types (and so in the CRDs) without regenerating
// the page fails here.
func TestPoolAPIPageIsUpToDate(t *testing.T) {
	root := filepath.Join("..", "..")
	want, err := render(filepath.Join(root, crdDir))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is stale: run `make manifests` and commit it", page)
	}
	// The page has what a user looks for.
	for _, s := range []string{"## GlobalVitistackIPPool", "## VitistackIPPool", "| `zone` |", "| `secretRef.key` | string | `\"secret\"`",
		"required", "one of `IPv4`, `IPv6`", "maximum 30", "| `addressesInUse` |"} {
		if !strings.Contains(want, s) {
			t.Errorf("the page has no %q:\n%s", s, want)
		}
	}
}
