// Command image writes the manager's container image as an OCI archive without a
// container engine, as `make image` runs it: the static manager binary on the layout the
// Dockerfile describes (distroless static, nonroot): /manager as the entrypoint, the user
// 65532:65532 (nonroot), /etc/passwd and /etc/group naming it, its home, /tmp, the CA
// certificates of the machine that builds it, and no shell or other program. The archive
// is an OCI image layout in a tar file, named by its org.opencontainers.image.ref.name
// and io.containerd.image.name annotations, which `ctr images import`, `docker load`
// (Docker 25 and later), `podman load` and `kind load image-archive` read. Every file's
// time is SOURCE_DATE_EPOCH (else 1970), so the same binary gives the same archive. The
// test node's other images (its pause image, say) are written the same way with
// --entrypoint.
package main
