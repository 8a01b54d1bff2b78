//! The client side of SASL SCRAM (RFC 5802, the SHA-256 and SHA-512 variants Kafka offers),
//! as pure steps: the first message, the answer to the server's challenge, and the check of
//! the server's final message (which proves the server knows the password too). No channel
//! binding (`n,,`), as Kafka's clients do.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::{digest, hmac, pbkdf2};

use streamapp_api::config::SaslMechanism;

/// Kafka refuses fewer iterations; more than this is a server asking for a denial of service.
const MAX_ITERATIONS: u32 = 100_000;

pub struct Scram {
    mechanism: SaslMechanism,
    password: String,
    client_nonce: String,
    client_first_bare: String,
}

/// What the client keeps between its final message and the server's.
pub struct AwaitingServerFinal {
    expected_server_signature: Vec<u8>,
}

impl Scram {
    /// Starts an exchange with a client nonce (random, printable, without commas).
    pub fn new(
        mechanism: SaslMechanism,
        username: &str,
        password: &str,
        client_nonce: String,
    ) -> Self {
        let name = username.replace('=', "=3D").replace(',', "=2C");
        Scram {
            mechanism,
            password: password.to_string(),
            client_first_bare: format!("n={name},r={client_nonce}"),
            client_nonce,
        }
    }

    /// A fresh random nonce.
    pub fn random_nonce() -> Result<String, String> {
        let mut bytes = [0u8; 24];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .map_err(|_| "no randomness for the SCRAM nonce".to_string())?;
        Ok(BASE64.encode(bytes))
    }

    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// The client's final message for the server's first one (`r=…,s=…,i=…`).
    pub fn client_final(
        &self,
        server_first: &str,
    ) -> Result<(String, AwaitingServerFinal), String> {
        let field = |name: char| {
            server_first
                .split(',')
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
                .ok_or_else(|| format!("the server's SCRAM challenge has no {name}="))
        };
        let nonce = field('r')?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err("the server's SCRAM nonce does not extend ours".into());
        }
        let salt = BASE64
            .decode(field('s')?)
            .map_err(|e| format!("the server's SCRAM salt: {e}"))?;
        let iterations: u32 = field('i')?
            .parse()
            .map_err(|e| format!("the server's SCRAM iteration count: {e}"))?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(format!("the server asks for {iterations} SCRAM iterations"));
        }
        let (pbkdf, mac, hash, len) = match self.mechanism {
            SaslMechanism::ScramSha256 => (
                pbkdf2::PBKDF2_HMAC_SHA256,
                hmac::HMAC_SHA256,
                &digest::SHA256,
                32,
            ),
            SaslMechanism::ScramSha512 => (
                pbkdf2::PBKDF2_HMAC_SHA512,
                hmac::HMAC_SHA512,
                &digest::SHA512,
                64,
            ),
            SaslMechanism::Plain => return Err("PLAIN is not SCRAM".into()),
        };
        let mut salted = vec![0u8; len];
        pbkdf2::derive(
            pbkdf,
            std::num::NonZeroU32::new(iterations).expect("checked"),
            &salt,
            self.password.as_bytes(),
            &mut salted,
        );
        let sign = |key: &[u8], data: &[u8]| {
            hmac::sign(&hmac::Key::new(mac, key), data)
                .as_ref()
                .to_vec()
        };
        let client_key = sign(&salted, b"Client Key");
        let stored_key = digest::digest(hash, &client_key);
        let without_proof = format!("c={},r={nonce}", BASE64.encode("n,,"));
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = sign(stored_key.as_ref(), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = sign(&salted, b"Server Key");
        Ok((
            format!("{without_proof},p={}", BASE64.encode(proof)),
            AwaitingServerFinal {
                expected_server_signature: sign(&server_key, auth_message.as_bytes()),
            },
        ))
    }
}

impl AwaitingServerFinal {
    /// Checks the server's final message: its signature proves it holds the password's keys.
    pub fn check(&self, server_final: &str) -> Result<(), String> {
        if let Some(error) = server_final.strip_prefix("e=") {
            return Err(format!("the server refused: {error}"));
        }
        let verifier = server_final
            .split(',')
            .find_map(|part| part.strip_prefix("v="))
            .ok_or("the server's final SCRAM message has no v=")?;
        let signature = BASE64
            .decode(verifier)
            .map_err(|e| format!("the server's SCRAM signature: {e}"))?;
        if signature != self.expected_server_signature {
            return Err(
                "the server's SCRAM signature is wrong: it does not know the password".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example exchange (user "user", password "pencil").
    #[test]
    fn the_rfc_7677_example_exchange() {
        let scram = Scram::new(
            SaslMechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO".into(),
        );
        assert_eq!(scram.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let (client_final, awaiting) = scram.client_final(server_first).unwrap();
        assert_eq!(
            client_final,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        awaiting
            .check("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(
            awaiting
                .check("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .is_err(),
            "a server that does not know the password is refused"
        );
        assert!(awaiting.check("e=invalid-proof").is_err());
    }

    #[test]
    fn a_server_nonce_that_does_not_extend_ours_is_refused() {
        let scram = Scram::new(SaslMechanism::ScramSha512, "u,=", "p", "abc".into());
        assert_eq!(scram.client_first(), "n,,n=u=2C=3D,r=abc");
        assert!(scram.client_final("r=xyz123,s=AAAA,i=4096").is_err());
        assert!(scram.client_final("r=abc,s=AAAA,i=4096").is_err());
        assert!(scram.client_final("r=abcd,s=AAAA,i=0").is_err());
    }
}
