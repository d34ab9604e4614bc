package record

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// Fingerprint is the fingerprint of a secret value. It is kept only on the Secret
// itself (annotation ipam.vitistack.io/value-fingerprints), where only those who may
// read the value can see it, never on a claim, an IPAddress or anywhere else.
func Fingerprint(value []byte) string {
	h := sha256.New()
	h.Write([]byte("ipam.vitistack.io/value-fingerprint\x00"))
	h.Write(value)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Fingerprints reads the fingerprints a Secret carries, by key. A malformed annotation
// reads as none (the protector writes it again).
func Fingerprints(annotations map[string]string) map[string]string {
	out := map[string]string{}
	if raw, ok := annotations[ipamv1alpha1.SecretFingerprintsAnnotation]; ok {
		_ = json.Unmarshal([]byte(raw), &out)
	}
	return out
}

// SetFingerprints writes fp onto a Secret's annotations (removing the annotation when
// fp is empty) and reports whether they changed.
func SetFingerprints(annotations map[string]string, fp map[string]string) bool {
	cur, present := annotations[ipamv1alpha1.SecretFingerprintsAnnotation]
	if len(fp) == 0 {
		delete(annotations, ipamv1alpha1.SecretFingerprintsAnnotation)
		return present
	}
	b, _ := json.Marshal(fp) //nolint:errchkjson // a map of strings, keys sorted
	if present && cur == string(b) {
		return false
	}
	annotations[ipamv1alpha1.SecretFingerprintsAnnotation] = string(b)
	return true
}
