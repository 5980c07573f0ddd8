// Package wire is the NATS contract between the xiaoclaw services: subject
// names, header names and message payloads. api/nats.md describes the same
// contract in prose; this package is the only place that builds a subject.
//
// Every identifier that becomes a subject token is validated here first, so
// a tenant or device id can never inject a wildcard or an extra token.
package wire

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidID is returned (wrapped) for any tenant, device or node id that
// may not be used in a subject or key.
var ErrInvalidID = errors.New("invalid id")

const maxIDLen = 64

// ValidTenant reports whether t is a valid tenant id: 1 to 63 characters of
// lower-case letters, digits and '-', starting with a letter or digit.
func ValidTenant(t string) error {
	if len(t) == 0 || len(t) > 63 {
		return fmt.Errorf("%w: tenant id must be 1-63 characters", ErrInvalidID)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0:
		default:
			return fmt.Errorf("%w: tenant id %q may hold only a-z, 0-9 and '-' (not first)", ErrInvalidID, t)
		}
	}
	return nil
}

// CanonicalDevice returns the canonical form of a device id as a device
// presents it. A MAC address (aa:bb:cc:dd:ee:ff or aa_bb_cc_dd_ee_ff, any case,
// as the XiaoZhi firmware sends it over WebSocket and MQTT) becomes 12
// lower-case hex digits, so a device keeps one identity across transports.
// Any other id must be 1-64 characters of [A-Za-z0-9_-] and is lower-cased.
func CanonicalDevice(id string) (string, error) {
	if mac, ok := parseMAC(id); ok {
		return mac, nil
	}
	if len(id) == 0 || len(id) > maxIDLen {
		return "", fmt.Errorf("%w: device id must be 1-%d characters", ErrInvalidID, maxIDLen)
	}
	b := []byte(id)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-':
		case c >= 'A' && c <= 'Z':
			b[i] = c + ('a' - 'A')
		default:
			return "", fmt.Errorf("%w: device id %q is neither a MAC address nor [A-Za-z0-9_-]", ErrInvalidID, id)
		}
	}
	return string(b), nil
}

// parseMAC accepts six hex octets separated by ':' or '_' (or '-').
func parseMAC(s string) (string, bool) {
	if len(s) != 17 {
		return "", false
	}
	sep := s[2]
	if sep != ':' && sep != '_' && sep != '-' {
		return "", false
	}
	var out [12]byte
	n := 0
	for i := 0; i < 17; i++ {
		c := s[i]
		if i%3 == 2 {
			if c != sep {
				return "", false
			}
			continue
		}
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		default:
			return "", false
		}
		out[n] = c
		n++
	}
	return string(out[:]), true
}

// NodePrefixXiaoZhi starts the node id of every device behind a devicehub.
const NodePrefixXiaoZhi = "xz-"

// DeviceNodeID is the stable OpenClaw node id of a device: "xz-" followed by
// the canonical device id (for a MAC, its 12 hex digits). The id is the same
// over WebSocket and MQTT and across reconnects.
func DeviceNodeID(canonicalDevice string) string { return NodePrefixXiaoZhi + canonicalDevice }

// DeviceFromNodeID returns the canonical device id behind a device node id.
func DeviceFromNodeID(nodeID string) (string, bool) {
	dev, ok := strings.CutPrefix(nodeID, NodePrefixXiaoZhi)
	if !ok || dev == "" {
		return "", false
	}
	if c, err := CanonicalDevice(dev); err != nil || c != dev {
		return "", false
	}
	return dev, true
}

// ValidNodeID reports whether a node id may be used as a subject token and a
// key in the node registry: 1-128 characters of [A-Za-z0-9_-].
// (OpenClaw node hosts use the hex SHA-256 of their public key.)
func ValidNodeID(id string) error {
	if len(id) == 0 || len(id) > 128 {
		return fmt.Errorf("%w: node id must be 1-128 characters", ErrInvalidID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: node id %q may hold only [A-Za-z0-9_-]", ErrInvalidID, id)
		}
	}
	return nil
}
