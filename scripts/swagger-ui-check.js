// Opens Swagger UI in headless Chromium, uses "Try it out" on POST /checkout with edited
// query parameters, then on POST /refunds to refund part of the order it charged, and
// prints the status and body the page shows each time. With CHECKOUT_API_KEY
// set (a service that needs keys), it first executes without a key and expects the 401,
// then enters the key with the Authorize button and executes again.
//   apt-get install chromium && npm install --prefix /tmp/pw playwright-core@1
//   cargo run &   NODE_PATH=/tmp/pw/node_modules node scripts/swagger-ui-check.js
//   key=$(cargo run -q -- api-keys create swagger --scope checkout,refund); cargo run &
//   CHECKOUT_API_KEY=$key NODE_PATH=/tmp/pw/node_modules node scripts/swagger-ui-check.js
// With HOOKS_FILE set, the same browser then checks an approval's links
// (scripts/approval-link-check.js).
const { chromium } = require('playwright-core');
const { checkLinks } = require('./approval-link-check.js');
const base = process.env.CHECKOUT_URL || 'http://127.0.0.1:8080';
const apiKey = process.env.CHECKOUT_API_KEY;
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
  const status = page.locator(`${op} .live-responses-table .response .response-col_status`).first();
  const body = page.locator(`${op} .live-responses-table .response-col_description pre`).first();
  // Executes and returns the status and body shown once the page has a new answer.
  let shown = '';
  const execute = async () => {
    await page.click(`${op} .execute`);
    await page.waitForFunction(([sel, before]) => {
      const el = document.querySelector(sel);
      return el && el.innerText !== before;
    }, [`${op} .live-responses-table .response-col_description pre`, shown]);
    shown = await body.innerText();
    return { status: (await status.innerText()).trim(), body: shown };
  };
  let failed = false;
  if (apiKey) {
    const refused = await execute();
    console.log(`without a key: status ${refused.status}`);
    console.log(refused.body);
    if (!refused.status.startsWith('401') || !refused.body.includes('"code": "unauthorized"')) failed = true;
    await page.click('.auth-wrapper .authorize');
    await page.locator('.modal-ux input[aria-label="auth-bearer-value"]').fill(apiKey);
    await page.click('.modal-ux .auth-btn-wrapper .authorize');
    await page.click('.modal-ux .btn-done');
    console.log('authorized with the key in Swagger UI');
  }
  const answer = await execute();
  console.log(`status ${answer.status}`);
  console.log(answer.body);
  if (!answer.status.startsWith('200') || !answer.body.includes(`"orderId": "${orderId}"`)
    || !answer.body.includes('"charged": true')) failed = true;
  // Money back: POST /refunds of 5.00 of the order just charged (the key, if any, is
  // authorized already; it needs the scope refund).
  const refundOp = '#operations-checkout-refund';
  await page.click(`${refundOp} .opblock-summary`);
  await page.click(`${refundOp} .try-out__btn`);
  const refundParam = (name) => page.locator(`${refundOp} tr[data-param-name="${name}"] input`);
  await refundParam('orderId').fill(orderId);
  await refundParam('amount').fill('5.00');
  await refundParam('reason').fill('');
  await refundParam('email').fill('');
  await page.click(`${refundOp} .execute`);
  const refundBody = page.locator(`${refundOp} .live-responses-table .response-col_description pre`).first();
  await refundBody.waitFor();
  const refundStatus = (await page.locator(`${refundOp} .live-responses-table .response .response-col_status`).first().innerText()).trim();
  const refunded = await refundBody.innerText();
  console.log(`refund: status ${refundStatus}`);
  console.log(refunded);
  await page.screenshot({ path: process.env.SCREENSHOT || '/tmp/swagger-ui.png' });
  if (!refundStatus.startsWith('200') || !refunded.includes('"refunded": true')
    || !refunded.includes('"refundedAmount": "5.00"')) failed = true;
  if (process.env.HOOKS_FILE) {
    console.log('--- approval links');
    const began = Date.now();
    const mismatches = await checkLinks(browser, base, process.env.HOOKS_FILE);
    console.log(`approval links: ${mismatches.length} mismatches, ${Date.now() - began} ms`);
    if (mismatches.length) failed = true;
  }
  await browser.close();
  if (failed) process.exit(1);
})().catch((e) => { console.error(e); process.exit(1); });
