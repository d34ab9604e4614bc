package ipamapi

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf16"
)

// Redact replaces every value in s with [redacted], in each form an echo of a request
// or an object may show it (an admission webhook's refusal, say): as it is;
// JSON-escaped, with and without HTML escaping, with non-ASCII as \u escapes, and
// escaped twice (a JSON document inside a string of another, as kubectl's
// last-applied-configuration is); base64 (standard or URL alphabet, with or without
// padding); hexadecimal; and as Go prints a byte slice. The longest forms go first, so
// that a short value inside a longer one (in a digest, say) cannot leave the rest of it
// behind. Empty values are skipped.
func Redact(s string, values ...string) string {
	var forms []string
	for _, v := range values {
		if v != "" {
			forms = append(forms, ValueForms(v)...)
		}
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, f := range slices.Compact(forms) {
		s = strings.ReplaceAll(s, f, redacted)
	}
	return s
}

// ValueForms is the forms of v that Redact cuts: what a scan for a leaked value must
// look for.
func ValueForms(v string) []string {
	b := []byte(v)
	forms := []string{v,
		// Unpadded base64 is a prefix of the padded text: it matches both.
		base64.RawStdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		hex.EncodeToString(b), fmt.Sprint(b)} //nolint:staticcheck // the list of decimal bytes is the form wanted
	esc, plain := jsonEscaped(v, true), jsonEscaped(v, false)
	return append(forms, esc, plain, asciiOnly(plain), jsonEscaped(esc, true), jsonEscaped(plain, false))
}

// jsonEscaped is v as it stands inside a JSON string (without the quotes).
func jsonEscaped(v string, escapeHTML bool) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(v) // a string always encodes
	return strings.TrimSuffix(strings.TrimSuffix(buf.String(), "\n"), `"`)[1:]
}

// asciiOnly writes every non-ASCII character of s as JSON's \u escape (a surrogate pair
// beyond the BMP), as Python's and other encoders do by default.
func asciiOnly(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x80 {
			b.WriteRune(r)
			continue
		}
		for _, u := range utf16.Encode([]rune{r}) {
			fmt.Fprintf(&b, `\u%04x`, u)
		}
	}
	return b.String()
}
