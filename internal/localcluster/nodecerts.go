package localcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"

	"github.com/pkg/errors"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const (
	// kubernetesServiceIP is the first address of the Service range: the kubernetes
	// Service's, at which Pods reach kube-apiserver.
	kubernetesServiceIP = "10.96.0.1"
	// apiServerPort is kube-apiserver's port on a node's control plane.
	apiServerPort = "6443"
	// nodeCAFile is the CA of kube-apiserver's serving certificate, in its cert dir.
	nodeCAFile = "serving-ca.crt"
)

// forPods configures api for a node's Pods: it serves on nodeIP:6443 with a
// certificate for that address, the kubernetes Service's address and its names, signed
// by a CA that kube-controller-manager publishes (nodeCAFile); service account tokens
// are signed with a key of its own; Pods get their token (the ServiceAccount admission
// plugin, which envtest turns off); webhooks are called at their endpoints, the kubelet
// (logs, exec) at the node's address.
//
// envtest writes its own serving certificate and signing key only where none is: they
// are written here first, and the CA handed to envtest for the clients it makes.
func forPods(api *envtest.APIServer, nodeIP string) error {
	serving := &api.SecureServing
	serving.Address, serving.Port = nodeIP, apiServerPort
	crt, key, err := certutil.GenerateSelfSignedCertKey("kubernetes",
		[]net.IP{net.ParseIP(nodeIP), net.ParseIP(kubernetesServiceIP), net.ParseIP("127.0.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return errors.Wrap(err, "making kube-apiserver's serving certificate")
	}
	// crt is the serving certificate, then the CA that signed it.
	leaf, rest := pem.Decode(crt)
	if leaf == nil || len(rest) == 0 {
		return errors.New("making kube-apiserver's serving certificate: no CA after the certificate")
	}
	ca := rest
	signer, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return errors.Wrap(err, "making the service account signing key")
	}
	signerKey, err := keyutil.MarshalPrivateKeyToPEM(signer)
	if err != nil {
		return errors.Wrap(err, "encoding the service account signing key")
	}
	pub, err := x509.MarshalPKIXPublicKey(&signer.PublicKey)
	if err != nil {
		return errors.Wrap(err, "encoding the service account public key")
	}
	for file, data := range map[string][]byte{
		"apiserver.crt": crt, "apiserver.key": key, nodeCAFile: ca,
		"sa-signer.key": signerKey, "sa-signer.crt": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	} {
		if err := os.WriteFile(filepath.Join(api.CertDir, file), data, 0o600); err != nil {
			return errors.Wrap(err, "writing kube-apiserver's certificates")
		}
	}
	serving.CA = ca
	api.Configure().Disable("disable-admission-plugins").Set("enable-aggregator-routing", "true").
		Set("kubelet-preferred-address-types", "InternalIP")
	return nil
}
