// A real OpenID Connect provider for the console's sign-in tests: the `oidc-provider` package, with its own
// (development) login and consent pages, static clients and three accounts whose claims carry modgate's
// roles and tenants. Usage: node provider.mjs PORT   (prints "listening <issuer>" once it serves)
//
// Clients are "native" (RFC 8252): their http://127.0.0.1 redirect URI is accepted on any port, so the
// tests' gateways listen wherever the system puts them.
//   modgate-console  confidential (client_secret_basic), code flow with PKCE
//   modgate-public   public (no secret), code flow with PKCE
// Accounts (any password: the development login page checks none):
//   olivia  operator
//   rita    reviewer of tenant-a
//   ravi    reviewer of tenant-b
//   nora    no modgate role
import Provider from 'oidc-provider';

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
  console.error('usage: node provider.mjs PORT');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const redirect = 'http://127.0.0.1/console/oidc/callback';

const ACCOUNTS = {
  olivia: { email: 'olivia@example.test', name: 'Olivia Operator', roles: ['modgate-operator'], tenants: [] },
  rita: { email: 'rita@example.test', name: 'Rita Reviewer', roles: ['modgate-reviewer'], tenants: ['tenant-a'] },
  ravi: { email: 'ravi@example.test', name: 'Ravi Reviewer', roles: ['modgate-reviewer'], tenants: ['tenant-b'] },
  nora: { email: 'nora@example.test', name: 'Nora Nobody', roles: ['staff'], tenants: ['tenant-a'] },
};

const configuration = {
  clients: [
    {
      client_id: 'modgate-console',
      client_secret: 'modgate-console-secret-0123456789',
      application_type: 'native',
      redirect_uris: [redirect],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    {
      client_id: 'modgate-public',
      application_type: 'native',
      redirect_uris: [redirect],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    },
  ],
  scopes: ['openid', 'email', 'profile', 'modgate'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    modgate: ['roles', 'tenants'],
  },
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true } },
  ttl: { IdToken: 300, AccessToken: 300, AuthorizationCode: 60, Interaction: 600, Session: 600, Grant: 600 },
  async findAccount(_ctx, id) {
    const account = ACCOUNTS[id];
    if (account === undefined) {
      return undefined;
    }
    return {
      accountId: id,
      async claims() {
        return { sub: id, email_verified: true, ...account };
      },
    };
  },
};

const provider = new Provider(issuer, configuration);
const server = provider.listen(port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
