// Vite builds the app into the Python package (python/svc/portal/static/, not in git), with
// the persisted operations' manifest beside index.html: the portal runs only those
// (python/svc/portal/webapp.py).
import { copyFileSync } from "node:fs";
import { resolve } from "node:path";
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

const outDir = resolve(__dirname, "../../python/svc/portal/static");

export default defineConfig({
  plugins: [
    react(),
    {
      name: "persisted-operations",
      closeBundle() {
        copyFileSync(
          resolve(__dirname, "src/gql/persisted-documents.json"),
          resolve(outDir, "persisted-operations.json"),
        );
      },
    },
  ],
  build: { outDir, emptyOutDir: true, sourcemap: false, chunkSizeWarningLimit: 800 },
});
