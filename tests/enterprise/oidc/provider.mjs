// A real OpenID provider for the OIDC tests: node-oidc-provider (OpenID-certified) on
// loopback. Usage: node provider.mjs PORT JWKS_FILE [WEB_REDIRECT]. Clients: denpex-cli
// (native, public, authorization code + PKCE, any loopback port), denpex-agent (confidential,
// client credentials) and, when WEB_REDIRECT is given, denpex-web (the web UI: confidential,
// authorization code + PKCE, that one callback). Access tokens for the resource
// urn:denpex:api are JWTs (RS256).
// devInteractions lets a test log in as any user name (password ignored): alice is in
// group gpu-sre, bob in ml-research, carol in no group.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, jwksFile, webRedirect] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const groups = { alice: ['gpu-sre'], bob: ['ml-research'], carol: [] };

const provider = new Provider(issuer, {
  jwks: JSON.parse(readFileSync(jwksFile, 'utf8')),
  clients: [
    {
      client_id: 'denpex-cli',
      application_type: 'native',
      token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: ['http://127.0.0.1/callback'],
    },
    // the web UI (confidential, authorization code + PKCE) when the test names its callback
    ...(webRedirect ? [{
      client_id: 'denpex-web',
      client_secret: 'web-secret-for-tests',
      token_endpoint_auth_method: 'client_secret_basic',
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: [webRedirect],
    }] : []),
    {
      client_id: 'denpex-agent',
      client_secret: 'agent-secret-for-tests',
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
    },
  ],
  pkce: { required: () => true },
  scopes: ['openid', 'groups', 'offline_access'],
  claims: { openid: ['sub'], groups: ['groups'] },
  conformIdTokenClaims: false,
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => 'urn:denpex:api',
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'groups',
        audience: 'urn:denpex:api',
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  findAccount: async (ctx, sub) => ({
    accountId: sub,
    claims: async () => ({ sub, groups: groups[sub] ?? [] }),
  }),
  ttl: { AccessToken: 600, ClientCredentials: 600, IdToken: 600 },
});
provider.listen(Number(port), '127.0.0.1', () => console.log(`listening ${issuer}`));
