package registrar

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// RedactSecret cuts the values and fingerprints of secs (a Secret as written, as it was, as it
// is now), also those in kubectl's last-applied-configuration, out of an error about writing
// it: an admission webhook may quote what it was sent, and the error reaches logs and the
// conditions and events of claims and pools whose readers may not read Secrets. An error with
// nothing to cut is returned as is, its type intact.
func RedactSecret(err error, secs ...*corev1.Secret) error {
	if err == nil {
		return nil
	}
	var values []string
	add := func(sec *corev1.Secret) {
		for _, v := range sec.Data {
			values = append(values, string(v), record.Fingerprint(v))
		}
		for _, v := range sec.StringData {
			values = append(values, v, record.Fingerprint([]byte(v)))
		}
		for _, fp := range record.Fingerprints(sec.Annotations) {
			values = append(values, fp)
		}
	}
	for _, sec := range secs {
		if sec == nil {
			continue
		}
		add(sec)
		applied := &corev1.Secret{}
		if json.Unmarshal([]byte(sec.Annotations[corev1.LastAppliedConfigAnnotation]), applied) == nil {
			add(applied)
		}
	}
	msg := err.Error()
	if cut := ipamapi.Redact(msg, values...); cut != msg {
		return redactedError(cut)
	}
	return err
}

// redactedError is an error's text with secrets cut out. It does not wrap the error
// it was made from, so nothing can get at the uncut text.
type redactedError string

func (e redactedError) Error() string { return string(e) }
