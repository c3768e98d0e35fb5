#!/usr/bin/env bash
# Makes the test certificates of tests/distributed_test.cpp (TLS): a CA, a
# coordinator and a worker certificate it signed, and a rogue CA with a
# certificate of its own (a peer without a valid certificate). For tests
# only: the private keys are public. Valid for 100 years; run again to
# replace them (needs the openssl program).
set -euo pipefail
cd "$(dirname "$0")"
days=36500
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() {  # name subject
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days $days -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() {  # name subject ca
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days $days -out "$1.pem" \
    -extfile <(printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n') 2>/dev/null
  rm -f "$1.csr"
}
ca ca "dpactor test CA"
leaf coordinator "dpactor test coordinator" ca
leaf worker "dpactor test worker" ca
ca rogue-ca "rogue CA"
leaf rogue "rogue worker" rogue-ca
rm -f ./*.srl
