package registrar

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// RedactSecret cuts the values of secs (a Secret as written, as it was, as it is now),
// and their fingerprints, out of the text of an error about writing it: an admission
// webhook that refuses a write may quote the objects it was sent, data and annotations,
// and the error goes on to logs, and to the conditions and events of claims and pools
// whose readers may not read Secrets. The values kubectl's last-applied-configuration
// annotation holds (earlier ones, perhaps) are cut too. See ipamapi.Redact for the forms
// cut. An error with nothing to cut is returned as it is (its type intact).
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
