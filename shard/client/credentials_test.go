package client

import (
	"errors"
	"testing"
)

// TestCredentialsCheck: incomplete or contradictory credentials are
// refused with their own error before any file is read.
func TestCredentialsCheck(t *testing.T) {
	for _, tc := range []struct {
		c    Credentials
		want error
	}{
		{Credentials{Insecure: true}, nil},
		{Credentials{Insecure: true, Token: "t"}, ErrInsecureWithCredentials},
		{Credentials{}, ErrNoCA},
		{Credentials{CAFile: "ca.crt"}, ErrNoCredential},
		{Credentials{CAFile: "ca.crt", CertFile: "c.crt"}, ErrCertWithoutKey},
		{Credentials{CAFile: "ca.crt", KeyFile: "c.key"}, ErrCertWithoutKey},
		{Credentials{CAFile: "ca.crt", CertFile: "c.crt", KeyFile: "c.key", Token: "t"}, ErrCertAndToken},
		{Credentials{CAFile: "ca.crt", Token: "t"}, nil},
	} {
		_, err := tc.c.DialOptions()
		if tc.want == nil {
			if err != nil && tc.c.Insecure {
				t.Errorf("%+v: %v", tc.c, err)
			}
			continue // with files to read, a missing file is the error
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.c, err, tc.want)
		}
	}
}
