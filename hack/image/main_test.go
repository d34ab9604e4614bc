package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// staticBinary builds a small static Go program, as the manager is built for the image.
func staticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static binary: %v\n%s", err, out)
	}
	return bin
}

// untar unpacks an archive into a new directory.
func untar(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The archive is what a container runtime imports: an OCI layout whose one image is
// named by the tag, runs /manager as 65532:65532 (nonroot) from its home, and holds the
// Dockerfile's distroless layout and nothing else: no shell, no other program. The same
// binary gives the same archive, byte for byte.
func TestTheArchiveIsTheDockerfilesImage(t *testing.T) {
	bin := staticBinary(t)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tag := "ghcr.io/vitistack/cluster-api-ipam-provider-vitistack:v0.2.0-test"
	out := filepath.Join(t.TempDir(), "images", "manager.tar")
	o := options{binary: bin, tag: tag, out: out, caCerts: ca, arch: "amd64"}
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(out); sha256.Sum256(again) != sha256.Sum256(first) {
		t.Error("writing the archive twice from the same binary gave two archives")
	}

	img, desc := openImage(t, out)
	ref, _ := name.NewTag(tag)
	if desc.Annotations["io.containerd.image.name"] != ref.Name() || desc.Annotations["org.opencontainers.image.ref.name"] != "v0.2.0-test" {
		t.Errorf("the image is named %v; want io.containerd.image.name %s and ref.name v0.2.0-test", desc.Annotations, ref.Name())
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.User != "65532:65532" ||
		!slices.Equal(cf.Config.Entrypoint, []string{"/manager"}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("config: os %s, arch %s, user %q, entrypoint %v, cmd %v; want linux, amd64, 65532:65532, [/manager], none",
			cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd)
	}

	type entry struct {
		mode     int64
		uid, gid int
		data     string
	}
	files := map[string]entry{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s has the time %s, not SOURCE_DATE_EPOCH's (1970)", h.Name, h.ModTime)
		}
		files[strings.TrimSuffix(h.Name, "/")] = entry{h.Mode, h.Uid, h.Gid, string(data)}
	}
	want := []string{"etc", "etc/group", "etc/passwd", "etc/ssl", "etc/ssl/certs", "etc/ssl/certs/ca-certificates.crt",
		"home", "home/nonroot", "manager", "tmp"}
	var got []string
	for n := range files {
		got = append(got, n)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("the image holds %v, want %v (no shell, no other program)", got, want)
	}
	binData, _ := os.ReadFile(bin)
	if m := files["manager"]; m.mode != 0o755 || m.uid != 0 || m.data != string(binData) {
		t.Errorf("/manager: mode %o, uid %d, same bytes as the binary %v; want 755, root's, the binary", m.mode, m.uid, m.data == string(binData))
	}
	if h := files["home/nonroot"]; h.uid != nonroot || h.gid != nonroot || h.mode != 0o700 {
		t.Errorf("/home/nonroot: %o %d:%d, want 700 65532:65532", h.mode, h.uid, h.gid)
	}
	if tmp := files["tmp"]; tmp.mode != 0o1777 {
		t.Errorf("/tmp has mode %o, want 1777", tmp.mode)
	}
	if !strings.Contains(files["etc/passwd"].data, "nonroot:x:65532:65532:") || !strings.Contains(files["etc/group"].data, "nonroot:x:65532:") {
		t.Errorf("/etc/passwd or /etc/group does not name nonroot 65532:\n%s\n%s", files["etc/passwd"].data, files["etc/group"].data)
	}
}

// openImage reads the archive out as a container runtime does: an OCI layout with one
// image.
func openImage(t *testing.T, out string) (v1.Image, v1.Descriptor) {
	t.Helper()
	p, err := layout.FromPath(untar(t, out))
	if err != nil {
		t.Fatalf("the archive is not an OCI image layout: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("the layout holds %d manifests, want 1", len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im.Manifests[0]
}

// The node's other images (pause, MetalLB's) are written the same way: the binary at
// --entrypoint, run as --user, without this project's labels or CA certificates when
// none are asked for. An entrypoint outside the image's root is refused.
func TestAnotherBinaryGetsItsEntrypointAndUser(t *testing.T) {
	out := filepath.Join(t.TempDir(), "speaker.tar")
	if err := run(options{binary: staticBinary(t), tag: "quay.io/metallb/speaker:v0.15.2", out: out, arch: "amd64",
		entrypoint: "/speaker", user: "0:0"}); err != nil {
		t.Fatal(err)
	}
	img, _ := openImage(t, out)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "0:0" || !slices.Equal(cf.Config.Entrypoint, []string{"/speaker"}) || len(cf.Config.Labels) != 0 {
		t.Errorf("config: user %q, entrypoint %v, labels %v; want 0:0, [/speaker], none", cf.Config.User, cf.Config.Entrypoint, cf.Config.Labels)
	}
	var names []string
	tr := tar.NewReader(mutate.Extract(img))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, strings.TrimSuffix(h.Name, "/"))
	}
	if !slices.Contains(names, "speaker") || slices.Contains(names, "manager") || slices.Contains(names, "etc/ssl") {
		t.Errorf("the image holds %v; want /speaker, no /manager, no CA certificates", names)
	}
	err = run(options{binary: staticBinary(t), tag: "example.org/x:v1", out: out, arch: "amd64", entrypoint: "/usr/bin/x"})
	if err == nil || !strings.Contains(err.Error(), "--entrypoint") {
		t.Errorf("--entrypoint /usr/bin/x: %v; want a refusal naming the flag", err)
	}
}

// A binary linked against the C library would not start in an image that has none: it is
// refused, with what to do.
func TestADynamicBinaryIsRefused(t *testing.T) {
	dynamic := "/bin/ls" // linked against the C library on every Linux machine with a shell
	err := run(options{binary: dynamic, tag: "example.org/x:v1", out: filepath.Join(t.TempDir(), "x.tar"), arch: "amd64"})
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("packaging %s: %v; want a refusal that says to build with CGO_ENABLED=0", dynamic, err)
	}
	if err := static(bytes.Repeat([]byte{0}, 64)); err == nil {
		t.Fatal("a file that is no binary was taken for one")
	}
}
