package release

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"
)

const (
	chartName = "cluster-api-ipam-provider-vitistack"
	image     = "ghcr.io/vitistack/cluster-api-ipam-provider-vitistack"
)

// assets is the release folder and its version (the folder's name, vMAJOR.MINOR.PATCH).
func assets(t *testing.T) (dir, version string) {
	t.Helper()
	dir = os.Getenv("E2E_RELEASE_ASSETS")
	if dir == "" {
		t.Skip("E2E_RELEASE_ASSETS is not set: 'make test' runs 'make release' and sets it")
	}
	version = filepath.Base(dir)
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(version) {
		t.Fatalf("the release folder %s is not named after a version", dir)
	}
	return dir, version
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The folder holds exactly what a release carries, and SHA256SUMS is right for each.
func TestReleaseIsComplete(t *testing.T) {
	g := NewWithT(t)
	dir, version := assets(t)
	want := []string{"SHA256SUMS", "ipam-components.yaml", "ipam-components-workload.yaml", "metadata.yaml",
		chartName + "-" + strings.TrimPrefix(version, "v") + ".tgz"}
	templates, err := filepath.Glob(filepath.Join("..", "..", "templates", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(templates).NotTo(BeEmpty())
	for _, f := range templates {
		want = append(want, filepath.Base(f))
	}
	entries, err := os.ReadDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	g.Expect(got).To(ConsistOf(want))

	sums := map[string]string{}
	s := bufio.NewScanner(strings.NewReader(string(read(t, filepath.Join(dir, "SHA256SUMS")))))
	for s.Scan() {
		sum, file, ok := strings.Cut(s.Text(), "  ")
		g.Expect(ok).To(BeTrue(), "a line of SHA256SUMS: %q", s.Text())
		sums[file] = sum
	}
	for _, f := range want {
		if f == "SHA256SUMS" {
			continue
		}
		digest := sha256.Sum256(read(t, filepath.Join(dir, f)))
		g.Expect(sums).To(HaveKeyWithValue(f, hex.EncodeToString(digest[:])), "SHA256SUMS for %s", f)
	}
	g.Expect(sums).To(HaveLen(len(want) - 1))
	for _, f := range templates {
		g.Expect(read(t, filepath.Join(dir, filepath.Base(f)))).To(Equal(read(t, f)), "%s is the repository's", filepath.Base(f))
	}
}

// Every version inside the release is the release's: the manager's image in both
// components files, a release series of clusterctl's metadata.yaml, the chart's version
// and appVersion (and so its default image), and a section of the changelog.
func TestReleaseVersionsAgree(t *testing.T) {
	g := NewWithT(t)
	dir, version := assets(t)
	for _, f := range []string{"ipam-components.yaml", "ipam-components-workload.yaml"} {
		images := regexp.MustCompile(`(?m)^\s+image: (\S+)$`).FindAllStringSubmatch(string(read(t, filepath.Join(dir, f))), -1)
		g.Expect(images).To(HaveLen(1), "%s has one image", f)
		g.Expect(images[0][1]).To(Equal(image+":"+version), f)
	}

	var metadata struct {
		ReleaseSeries []series `json:"releaseSeries"`
	}
	g.Expect(yaml.Unmarshal(read(t, filepath.Join(dir, "metadata.yaml")), &metadata)).To(Succeed())
	parts := strings.Split(strings.TrimPrefix(version, "v"), ".")
	major, err := strconv.Atoi(parts[0])
	g.Expect(err).NotTo(HaveOccurred())
	minor, err := strconv.Atoi(parts[1])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(metadata.ReleaseSeries).To(ContainElement(series{Major: major, Minor: minor, Contract: "v1beta2"}),
		"metadata.yaml has no release series %d.%d with contract v1beta2", major, minor)

	chart := chartYAML(t, filepath.Join(dir, chartName+"-"+strings.TrimPrefix(version, "v")+".tgz"))
	g.Expect(chart).To(HaveKeyWithValue("version", strings.TrimPrefix(version, "v")))
	g.Expect(chart).To(HaveKeyWithValue("appVersion", version))

	changelog := string(read(t, filepath.Join("..", "..", "CHANGELOG.md")))
	g.Expect(changelog).To(MatchRegexp(`(?m)^## \[`+regexp.QuoteMeta(strings.TrimPrefix(version, "v"))+`\]`), "CHANGELOG.md has no section for %s", version)
}

// series is a release series of clusterctl's metadata.yaml.
type series struct {
	Major    int    `json:"major"`
	Minor    int    `json:"minor"`
	Contract string `json:"contract"`
}

// chartYAML reads Chart.yaml from a chart archive.
func chartYAML(t *testing.T, archive string) map[string]any {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			t.Fatalf("%s has no %s/Chart.yaml", archive, chartName)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == chartName+"/Chart.yaml" {
			b, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]any{}
			if err := yaml.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
}
