package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/pkg/errors"
)

// nonroot is distroless' nonroot user and group; nonrootUser the image's user.
const (
	nonroot     = 65532
	nonrootUser = "65532:65532"
)

// caFile is where distroless keeps the CA certificates, and where Go's crypto/x509 looks
// for them on Linux.
const caFile = "/etc/ssl/certs/ca-certificates.crt"

// manager is where the Dockerfile puts the manager.
const manager = "/manager"

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "the static binary (CGO_ENABLED=0): the manager, unless --entrypoint says otherwise")
	flag.StringVar(&o.tag, "tag", "", "the image's name and tag, e.g. ghcr.io/vitistack/cluster-api-ipam-provider-vitistack:v0.2.0")
	flag.StringVar(&o.out, "out", "", "the OCI archive to write")
	flag.StringVar(&o.caCerts, "ca-certificates", caFile, "the CA certificates to ship (empty: none)")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "the binary's architecture")
	flag.StringVar(&o.user, "user", nonrootUser, "the user:group the image runs as (distroless' nonroot; MetalLB's speaker, which sends ARP answers, runs as 0:0)")
	flag.StringVar(&o.entrypoint, "entrypoint", manager, "where the binary goes in the image, run as its entrypoint (the test node's other images: /pause, say); only the manager's image carries this project's labels")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type options struct{ binary, tag, out, caCerts, arch, entrypoint, user string }

func run(o options) error {
	if o.binary == "" || o.tag == "" || o.out == "" {
		return errors.New("--binary, --tag and --out are required")
	}
	if o.entrypoint == "" {
		o.entrypoint = manager
	}
	if o.user == "" {
		o.user = nonrootUser
	}
	if !strings.HasPrefix(o.entrypoint, "/") || strings.Count(o.entrypoint, "/") != 1 ||
		slices.Contains([]string{"/", "/etc", "/home", "/tmp"}, o.entrypoint) {
		return errors.Errorf("--entrypoint %q: want a file in the image's root, such as /manager", o.entrypoint)
	}
	ref, err := name.NewTag(o.tag)
	if err != nil {
		return errors.Wrapf(err, "--tag %q", o.tag)
	}
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	img, err := build(o, epoch)
	if err != nil {
		return err
	}
	return writeArchive(o.out, ref, img, epoch)
}

// sourceDateEpoch is SOURCE_DATE_EPOCH (reproducible builds), else 1970.
func sourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, errors.Wrapf(err, "SOURCE_DATE_EPOCH %q", v)
	}
	return time.Unix(s, 0).UTC(), nil
}

// file is one entry of the image's only layer.
type file struct {
	path     string
	mode     int64
	uid, gid int
	data     []byte // nil: a directory
}

// build is the image: one layer with the files, and the Dockerfile's user and entrypoint.
func build(o options, epoch time.Time) (v1.Image, error) {
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return nil, errors.Wrap(err, "reading the binary")
	}
	if err := static(bin); err != nil {
		return nil, errors.Wrapf(err, "%s", o.binary)
	}
	files := []file{
		{path: "etc", mode: 0o755},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{path: "home", mode: 0o755},
		{path: "home/nonroot", mode: 0o700, uid: nonroot, gid: nonroot},
		{path: strings.TrimPrefix(o.entrypoint, "/"), mode: 0o755, data: bin},
		{path: "tmp", mode: 0o1777},
	}
	if o.caCerts != "" {
		ca, err := os.ReadFile(o.caCerts)
		if err != nil {
			return nil, errors.Wrap(err, "reading the CA certificates (--ca-certificates \"\" ships none)")
		}
		files = append(files, file{path: "etc/ssl", mode: 0o755}, file{path: "etc/ssl/certs", mode: 0o755},
			file{path: strings.TrimPrefix(caFile, "/"), mode: 0o644, data: ca})
	}
	layerTar, err := tarOf(files, epoch)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, errors.Wrap(err, "making the layer")
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "hack/image: " + o.entrypoint + " on distroless static's nonroot layout", Comment: "make image"}})
	if err != nil {
		return nil, errors.Wrap(err, "adding the layer")
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, errors.Wrap(err, "reading the config")
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", o.arch, v1.Time{Time: epoch}
	cf.Config.User = o.user
	cf.Config.Entrypoint = []string{o.entrypoint}
	cf.Config.WorkingDir = "/home/nonroot"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=" + caFile}
	if o.entrypoint == manager {
		cf.Config.Labels = map[string]string{
			"org.opencontainers.image.source": "https://github.com/vitistack/cluster-api-ipam-provider-vitistack",
			"org.opencontainers.image.title":  "cluster-api-ipam-provider-vitistack",
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	return img, errors.Wrap(err, "writing the config")
}

// tarOf is the layer's tar: the files in path order, owned by their uid and gid, at epoch.
func tarOf(files []file, epoch time.Time) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.path, b.path) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: epoch, Format: tar.FormatPAX}
		if f.data == nil {
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, errors.Wrapf(err, "writing %s", f.path)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, errors.Wrapf(err, "writing %s", f.path)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, errors.Wrap(err, "closing the layer")
	}
	return buf.Bytes(), nil
}

// writeArchive writes img as an OCI image layout, named ref, in a tar file at path.
func writeArchive(path string, ref name.Tag, img v1.Image, epoch time.Time) error {
	dir, err := os.MkdirTemp("", "image-layout-")
	if err != nil {
		return errors.Wrap(err, "making a directory for the layout")
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return errors.Wrap(err, "writing the layout")
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	})); err != nil {
		return errors.Wrap(err, "writing the image into the layout")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return errors.Wrap(err, "making the archive's directory")
	}
	tmp := path + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return errors.Wrap(err, "creating the archive")
	}
	if err := tarDir(out, dir, epoch); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return errors.Wrap(err, "closing the archive")
	}
	return errors.Wrap(os.Rename(tmp, path), "writing the archive")
}

// tarDir writes the directory's files into a tar, in path order, at epoch.
func tarDir(w io.Writer, dir string, epoch time.Time) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return errors.Wrap(err, "writing the archive")
	}
	return errors.Wrap(tw.Close(), "closing the archive")
}
