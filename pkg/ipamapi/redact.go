package ipamapi

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
)

// Redact replaces every value in s with [redacted], in each form an echo of a request
// or an object may show it (an admission webhook's refusal, say): as it is;
// JSON-escaped, with and without HTML escaping, with non-ASCII as \u escapes, and
// escaped twice (a JSON document inside a string of another, as kubectl's
// last-applied-configuration is); quoted as Go quotes it; percent-encoded; base64
// (standard or URL alphabet, with or without padding, alone or inside a longer blob);
// hexadecimal in either case; and as Go prints a byte slice. The longest forms go
// first, so that a short value inside a longer one (in a digest, say) cannot leave the
// rest of it behind. Empty values are skipped.
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
	h := hex.EncodeToString(b)
	forms := []string{v,
		// Unpadded base64 is a prefix of the padded text: it matches both.
		base64.RawStdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		h, strings.ToUpper(h), fmt.Sprint(b), fmt.Sprintf("% x", b), //nolint:staticcheck // the list of decimal bytes is a form wanted
		url.QueryEscape(v), url.PathEscape(v), percentEscaped(b, false), percentEscaped(b, true),
		unquoted(strconv.Quote(v)), unquoted(strconv.QuoteToASCII(v))}
	// Inside a longer base64 blob (a Secret's data of several values, a basic-auth
	// header) the value's own characters depend on its offset there, modulo 3.
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for offset := range 3 {
			if inside := base64Inside(enc, b, offset); len(inside) >= 8 {
				forms = append(forms, inside)
			}
		}
	}
	esc, plain := jsonEscaped(v, true), jsonEscaped(v, false)
	return append(forms, esc, plain, asciiOnly(esc), asciiOnly(plain),
		jsonEscaped(esc, true), jsonEscaped(esc, false), jsonEscaped(plain, true), jsonEscaped(plain, false))
}

// base64Inside is the part of b's base64, b being offset bytes into a longer blob,
// that depends on b's bytes alone (whole groups of three).
func base64Inside(enc *base64.Encoding, b []byte, offset int) string {
	s := enc.EncodeToString(append(make([]byte, offset), b...))
	from, to := (offset+2)/3*4, (offset+len(b))/3*4
	if from >= to {
		return ""
	}
	return s[from:to]
}

// percentEscaped is b with every byte percent-escaped.
func percentEscaped(b []byte, upper bool) string {
	format := "%%%02x"
	if upper {
		format = "%%%02X"
	}
	var sb strings.Builder
	for _, c := range b {
		fmt.Fprintf(&sb, format, c)
	}
	return sb.String()
}

func unquoted(q string) string { return q[1 : len(q)-1] }

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
