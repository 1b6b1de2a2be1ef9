// A real OpenID provider for the console's tests: npm `oidc-provider` (panva, OpenID certified), its development
// login and consent pages, one client "llmgw-console" whose logins need PKCE (S256), and every login's e-mail claim
// the login name typed on its page. Usage: node oidc_provider.mjs PORT REDIRECT_URI (the package's directory in
// $OIDC_PROVIDER_DIR); prints "ready" once listening on 127.0.0.1:PORT.
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const [port, redirectUri] = process.argv.slice(2);
const entry = path.join(process.env.OIDC_PROVIDER_DIR, 'node_modules', 'oidc-provider', 'lib', 'index.js');
const { default: Provider } = await import(pathToFileURL(entry).href);

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: 'llmgw-console',
    client_secret: 'llmgw-console-test-secret',
    redirect_uris: [redirectUri],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_post',
  }],
  pkce: { required: () => true },
  claims: { openid: ['sub'], email: ['email', 'email_verified'] },
  findAccount: async (ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, email: id, email_verified: true }),
  }),
  cookies: { keys: ['a-cookie-key-for-tests-only'] },
  features: { devInteractions: { enabled: true } },
});
provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));
