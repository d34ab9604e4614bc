package sim

import (
	"encoding/json"
	"io"
	"net"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pkg/errors"
)

// Messages of the real server, byte-exact (misspellings included).
const (
	msgParseError          = "Could not parse incomming request"
	msgRetentionTooLong    = "retention period cannot be more than 30 days"
	msgWrongFamily         = "invalid ip familiy for the provided address"
	msgRegistered          = "Address registered successfully"
	msgUpdated             = "Address updated successfully"
	msgExpirationSet       = "Service expiration set successfully"
	prefixRegisterError    = "Could not register address: "
	prefixDeregisterError  = "Could not deregister service: "
	reasonNoMatch          = "no matching address found with the provided secret, zone and address"
	reasonNoMatchDelete    = "no matching address found with the provivded secret, zone and address"
	reasonNoService        = "service does not exist for this address"
	reasonNotInZone        = "the requested address is not valid for the provided zone"
	reasonMultipleServices = "multiple services registered. unable to change secret"
	reasonServiceMismatch  = "service mismatch. unable to change secret"
	prefixFetchZones       = "failed to fetch zones: "
	prefixQueryFailed      = "failed to query address documents: "
	prefixReadFailed       = "failed to read address document: "
)

// apiService mirrors the real server's Service struct: same JSON names and Go types,
// so that encoding/json accepts and rejects exactly the same bodies.
type apiService struct {
	ServiceName         string     `json:"service_name"`
	NamespaceID         string     `json:"namespace_id"`
	ClusterID           string     `json:"cluster_id"`
	RetentionPeriodDays int        `json:"retention_period_days,omitempty"`
	ExpiresAt           *time.Time `json:"expires_at,omitempty"`
	DenyExternalCleanup bool       `json:"deny_external_cleanup,omitempty"`
}

// apiRequest mirrors the real server's IpamAPIRequest.
type apiRequest struct {
	Secret    string     `json:"secret"`
	Zone      string     `json:"zone"`
	IPFamily  string     `json:"ip_family"`
	Address   string     `json:"address"`
	Service   apiService `json:"service"`
	NewSecret string     `json:"new_secret,omitempty"`
}

func (r *apiRequest) ref() ServiceRef {
	return ServiceRef{ServiceName: r.Service.ServiceName, NamespaceID: r.Service.NamespaceID, ClusterID: r.Service.ClusterID}
}

// decodeRequest decodes like gin's ShouldBindJSON: one json.Decoder.Decode into the
// struct (unknown fields ignored, trailing data after the first value ignored, an empty
// body is an error). gin's own validation step is a no-op here because the real struct
// carries `validate` tags, not `binding` tags.
func decodeRequest(body io.Reader) (*apiRequest, error) {
	if body == nil {
		return nil, errors.New("invalid request")
	}
	var req apiRequest
	if err := json.NewDecoder(body).Decode(&req); err != nil {
		return nil, errors.Wrap(err, "decoding request")
	}
	return &req, nil
}

// fieldErr formats one go-playground/validator v10 FieldError.
func fieldErr(ns, field, tag string) string {
	return "Key: '" + ns + "' Error:Field validation for '" + field + "' failed on the '" + tag + "' tag"
}

// structErrors reproduces validator.New().Struct(req).Error() for the tags of the real
// request struct:
//
//	Secret   `validate:"required,min=8,max=64"`
//	Zone     `validate:"required"`
//	IPFamily `validate:"required,oneof=ipv4 ipv6"`
//	Service.ServiceName, Service.NamespaceID, Service.ClusterID `validate:"required"`
//
// Fields are reported in declaration order, one error per field (the first failing tag),
// joined by "\n". String lengths count runes, like the validator does.
// Assumption: the v1.0.40 Go names are IpamAPIRequest, IPFamily, NamespaceID, ClusterID
// (ipam-api.md quotes the first two; the last two follow the same renaming).
func structErrors(r *apiRequest) string {
	var errs []string
	const root = "IpamAPIRequest."
	switch n := utf8.RuneCountInString(r.Secret); {
	case r.Secret == "":
		errs = append(errs, fieldErr(root+"Secret", "Secret", "required"))
	case n < 8:
		errs = append(errs, fieldErr(root+"Secret", "Secret", "min"))
	case n > 64:
		errs = append(errs, fieldErr(root+"Secret", "Secret", "max"))
	}
	if r.Zone == "" {
		errs = append(errs, fieldErr(root+"Zone", "Zone", "required"))
	}
	switch r.IPFamily {
	case "":
		errs = append(errs, fieldErr(root+"IPFamily", "IPFamily", "required"))
	case FamilyIPv4, FamilyIPv6:
	default:
		errs = append(errs, fieldErr(root+"IPFamily", "IPFamily", "oneof"))
	}
	if r.Service.ServiceName == "" {
		errs = append(errs, fieldErr(root+"Service.ServiceName", "ServiceName", "required"))
	}
	if r.Service.NamespaceID == "" {
		errs = append(errs, fieldErr(root+"Service.NamespaceID", "NamespaceID", "required"))
	}
	if r.Service.ClusterID == "" {
		errs = append(errs, fieldErr(root+"Service.ClusterID", "ClusterID", "required"))
	}
	return strings.Join(errs, "\n")
}

// familyOf reproduces the real server's IPFamilyFromPrefix: the part before the first
// "/" must parse with net.ParseIP (the suffix is not checked); IPv4 and IPv4-mapped
// IPv6 count as ipv4.
func familyOf(address string) (string, bool) {
	ip := net.ParseIP(strings.Split(address, "/")[0])
	if ip == nil {
		return "", false
	}
	if ip.To4() != nil {
		return FamilyIPv4, true
	}
	return FamilyIPv6, true
}

// validate runs the checks of the real ValidateRequest in order and returns the 400
// message of the first failure, or "". With prefixesLoading the prefix cache is empty,
// so the last check fails for every zone and family; loading reports that this is why
// the request failed (the zone has containers of the family).
func (zt *zoneTable) validate(r *apiRequest, prefixesLoading bool) (msg string, loading bool) {
	msg = zt.validateZone(r)
	if msg != "" {
		return msg, false
	}
	noPrefixes := "no prefixes found for zone " + r.Zone + " with IP family " + r.IPFamily
	if len(zt.containers[r.Zone][r.IPFamily]) == 0 {
		return noPrefixes, false
	}
	if prefixesLoading {
		return noPrefixes, true
	}
	return "", false
}

// validateZone is ValidateRequest up to (not including) the prefix-cache check.
func (zt *zoneTable) validateZone(r *apiRequest) string {
	if msg := structErrors(r); msg != "" {
		return msg
	}
	if r.Service.RetentionPeriodDays > 30 {
		return msgRetentionTooLong
	}
	if _, ok := zt.containers[r.Zone]; !ok {
		quoted := make([]string, len(zt.order))
		for i, z := range zt.order {
			quoted[i] = "'" + z + "'"
		}
		return "invalid zone '" + r.Zone + "', must be one of: " + strings.Join(quoted, ", ")
	}
	if r.Address != "" {
		fam, ok := familyOf(r.Address)
		if !ok {
			return "invalid ip prefix: " + r.Address
		}
		if fam != r.IPFamily {
			return msgWrongFamily
		}
	}
	return ""
}
