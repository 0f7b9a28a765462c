// Opens Swagger UI in headless Chromium, uses "Try it out" on POST /checkout with edited
// query parameters, and prints the status and body the page shows.
//   apt-get install chromium && npm install --prefix /tmp/pw playwright-core@1
//   cargo run &   NODE_PATH=/tmp/pw/node_modules node scripts/swagger-ui-check.js
const { chromium } = require('playwright-core');
const base = process.env.CHECKOUT_URL || 'http://127.0.0.1:8080';
(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 1800 } });
  await page.goto(`${base}/swagger-ui/`);
  const op = '#operations-checkout-checkout';
  await page.click(`${op} .opblock-summary`);
  await page.click(`${op} .try-out__btn`);
  const param = (name) => page.locator(`${op} tr[data-param-name="${name}"] input`);
  const orderId = `SWAGGER-${Date.now()}`;
  await param('orderId').fill(orderId);
  await param('amount').fill('19.99');
  await page.click(`${op} .execute`);
  const status = page.locator(`${op} .live-responses-table .response .response-col_status`).first();
  await status.waitFor();
  const body = await page.locator(`${op} .live-responses-table .response-col_description pre`).first().innerText();
  console.log(`status ${(await status.innerText()).trim()}`);
  console.log(body);
  await page.screenshot({ path: process.env.SCREENSHOT || '/tmp/swagger-ui.png' });
  await browser.close();
  if (!body.includes(`"orderId": "${orderId}"`) || !body.includes('"charged": true')) process.exit(1);
})().catch((e) => { console.error(e); process.exit(1); });
