// graphql-codegen: typed documents from the portal's exported schema, and the manifest of
// persisted operations (docs/portal.md#the-web-app). Output in src/gql/ (not in git).
import type { CodegenConfig } from "@graphql-codegen/cli";

const config: CodegenConfig = {
  schema: "../../python/svc/portal/schema.graphql",
  documents: ["src/**/*.{ts,tsx}", "!src/gql/**/*"],
  ignoreNoDocuments: false,
  generates: {
    "./src/gql/": {
      preset: "client",
      presetConfig: {
        fragmentMasking: false,
        persistedDocuments: { hashAlgorithm: "sha256", mode: "embedHashInDocument" },
      },
      config: {
        documentMode: "string",
        enumsAsTypes: true,
        useTypeImports: true,
        scalars: { DateTime: "string", JSON: "unknown" },
      },
    },
  },
};

export default config;
