//! Standard Webhooks' signature: `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")),
//! the key being the base64 after `whsec_` in the secret. During a rotation a secret lists
//! several `whsec_…` separated by spaces or commas, and a request carries one signature per
//! key, space-separated in `webhook-signature`: a consumer holding any one of them verifies.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;

use crate::secret::Secret;

/// The fewest and most bytes a key may have (Standard Webhooks: 24 to 64).
pub const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A signing key, read from a `whsec_…` secret: ring's HMAC-SHA256 key, its padded blocks
/// hashed once.
#[derive(Clone)]
pub struct SigningKey(hmac::Key);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(…)")
    }
}

impl SigningKey {
    /// The key of `secret`: `whsec_` + base64 of 24 to 64 bytes, else why not.
    pub fn parse(secret: &Secret) -> Result<SigningKey, String> {
        let text = secret.expose();
        let Some(encoded) = text.strip_prefix("whsec_") else {
            return Err("must start with whsec_ (whsec_ + base64 of 24 to 64 random bytes)".into());
        };
        let key = STANDARD.decode(encoded).map_err(|_| {
            "must be whsec_ + base64 (the part after whsec_ is not base64)".to_owned()
        })?;
        if !KEY_BYTES.contains(&key.len()) {
            return Err(format!(
                "must be whsec_ + base64 of 24 to 64 bytes, not {} bytes",
                key.len()
            ));
        }
        Ok(SigningKey::of(&key))
    }

    fn of(key: &[u8]) -> SigningKey {
        SigningKey(hmac::Key::new(hmac::HMAC_SHA256, key))
    }

    /// The `webhook-signature` header's value for message `id` sent at `timestamp` (Unix
    /// seconds) with `body`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &str) -> String {
        let timestamp = timestamp.to_string();
        let mac = self.mac(&[id, ".", &timestamp, ".", body]);
        format!("v1,{}", STANDARD.encode(mac))
    }

    /// HMAC (RFC 2104) over SHA-256 of `parts`, one after the other.
    fn mac(&self, parts: &[&str]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.0);
        for part in parts {
            context.update(part.as_bytes());
        }
        context.sign()
    }
}

/// The keys of a secret that lists one or more `whsec_…`, separated by spaces or commas:
/// each signs every request.
#[derive(Clone, Debug)]
pub struct SigningKeys(Vec<SigningKey>);

impl SigningKeys {
    /// Every key of `secret`, else why not (naming which one, when it lists several).
    pub fn parse(secret: &Secret) -> Result<SigningKeys, String> {
        let listed: Vec<&str> = secret
            .expose()
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .collect();
        if listed.is_empty() {
            return Err("must be whsec_ + base64 of 24 to 64 random bytes".into());
        }
        let keys = listed
            .iter()
            .enumerate()
            .map(|(i, one)| {
                SigningKey::parse(&Secret::new(*one)).map_err(|e| match listed.len() {
                    1 => e,
                    n => format!("secret {} of {n}: {e}", i + 1),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(SigningKeys(keys))
    }

    /// The `webhook-signature` header's value: each key's signature, space-separated, in
    /// the order the secret lists them.
    pub fn sign(&self, id: &str, timestamp: i64, body: &str) -> String {
        let signatures: Vec<String> = self.0.iter().map(|k| k.sign(id, timestamp, body)).collect();
        signatures.join(" ")
    }

    /// How many keys sign.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: a secret lists at least one key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 (a short key) and 6 (a key longer than the block), the message in
        // parts as a signature's are.
        assert_eq!(
            hex(SigningKey::of(b"Jefe")
                .mac(&["what do ya ", "want for nothing?"])
                .as_ref()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(SigningKey::of(&[0xaa; 131])
                .mac(&["Test Using Larger Than Block-Size Key - Hash Key First"])
                .as_ref()),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn the_signature_is_standard_webhooks_own_example() {
        // The example of the Standard Webhooks specification (its libraries' test).
        let key =
            SigningKey::parse(&Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).unwrap();
        assert_eq!(
            key.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                r#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    // Seen failing: with `SigningKeys::sign` signing with the first key only, the header
    // carried one signature where two.
    #[test]
    fn several_secrets_sign_once_each_and_a_bad_one_is_named() {
        let b64 = |n: usize| STANDARD.encode(vec![7u8; n]);
        let (old, new) = (format!("whsec_{}", b64(24)), format!("whsec_{}", b64(32)));
        for listed in [
            format!("{old} {new}"),
            format!("{old},{new}"),
            format!(" {old} ,\t{new} "),
        ] {
            let keys = SigningKeys::parse(&Secret::new(listed.as_str())).unwrap();
            assert_eq!(keys.len(), 2, "{listed:?}");
            let one = |s: &str| {
                SigningKey::parse(&Secret::new(s))
                    .unwrap()
                    .sign("msg_1", 7, "{}")
            };
            assert_eq!(
                keys.sign("msg_1", 7, "{}"),
                format!("{} {}", one(&old), one(&new))
            );
        }
        let bad = format!("{old} whsec_{}", b64(16));
        assert_eq!(
            SigningKeys::parse(&Secret::new(bad.as_str())).unwrap_err(),
            "secret 2 of 2: must be whsec_ + base64 of 24 to 64 bytes, not 16 bytes"
        );
        assert!(SigningKeys::parse(&Secret::new(" , ")).is_err());
    }

    #[test]
    fn a_secret_that_is_not_whsec_and_24_to_64_bytes_is_refused() {
        let b64 = |n: usize| STANDARD.encode(vec![7u8; n]);
        assert!(SigningKey::parse(&Secret::new(format!("whsec_{}", b64(24)))).is_ok());
        assert!(SigningKey::parse(&Secret::new(format!("whsec_{}", b64(64)))).is_ok());
        for bad in [
            format!("whsec_{}", b64(23)),
            format!("whsec_{}", b64(65)),
            b64(32),
            "whsec_not*base64".to_owned(),
            String::new(),
        ] {
            assert!(
                SigningKey::parse(&Secret::new(bad.as_str())).is_err(),
                "{bad:?}"
            );
        }
    }
}
