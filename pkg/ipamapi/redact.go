package ipamapi

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
)

// Redact replaces every value in s with [redacted]: as it is, JSON-escaped (a value
// inside a JSON document), and base64-encoded (a Secret's data in an object someone
// echoes, an admission webhook's refusal say). The longest forms go first, so that a
// short value inside a longer one (a digest, say) cannot leave the rest of it behind.
// Empty values are skipped.
func Redact(s string, values ...string) string {
	var forms []string
	for _, v := range values {
		if v == "" {
			continue
		}
		forms = append(forms, v, base64.StdEncoding.EncodeToString([]byte(v)))
		if esc, err := json.Marshal(v); err == nil {
			forms = append(forms, strings.Trim(string(esc), `"`))
		}
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, f := range forms {
		s = strings.ReplaceAll(s, f, redacted)
	}
	return s
}
